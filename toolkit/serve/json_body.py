"""A request body read as a JSON object and validated against a pydantic model: each refusal a 400 in OpenAI's
shape (routes that answer in another shape convert the ApiError). Shared by every route that takes a JSON body."""
from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from toolkit.serve.protocol import ApiError, validation_error


async def read_object(request) -> dict:
    """The body as a JSON object: malformed JSON, nesting too deep for the parser, or a non-object are a 400."""
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}", None, "json_invalid") from None
    except RecursionError:  # arrays / objects nested thousands deep: the parser gives up (was a bare 500)
        raise ApiError(400, "malformed JSON body: nested too deeply", None, "json_invalid") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", None, "json_invalid")
    return data


def validated(model: type[BaseModel], data: dict):
    """`data` as `model`, or the 400 naming the field (validation_error)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None
