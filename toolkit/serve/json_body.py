"""A request body read as a JSON object and validated against a pydantic model: each refusal a 400 in OpenAI's
shape (routes that answer in another shape convert the ApiError). Shared by every route that takes a JSON body."""
from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from toolkit.serve.api_error import ApiError, validation_error


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
    if why := unpaired_surrogate(data):
        raise ApiError(400, f"the body holds {why}", None, "json_invalid")
    return data


def unpaired_surrogate(data) -> str | None:
    """What is wrong with JSON whose \\uD800-style escape decoded to no Unicode (an unpaired surrogate, which no
    tokenizer encodes: a 500 deep in a request), or None. One pass: re-encoding it as UTF-8."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        return f"an unpaired surrogate escape ({e.object[e.start]!r}), not valid Unicode"
    return None


def validated(model: type[BaseModel], data: dict):
    """`data` as `model`, or the 400 naming the field (validation_error)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None
