"""OpenAI-style errors: every refusal the server makes is an `ApiError`, an HTTP status plus
{"error": {"message", "type", "param", "code"}} as the OpenAI API returns it, with `param` naming the offending
field; `validation_error` turns pydantic's errors into one."""
from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _field_path(loc) -> tuple[list[str], str | None]:
    """pydantic loc -> the field path, and the union member it tried (e.g. 'str', 'list[TextPart]'), if any."""
    path = []
    for x in loc:
        if x in ("body", "query", "path"):  # where FastAPI found it: the field's name says enough
            continue
        if isinstance(x, str) and ("[" in x or x in ("str", "int", "float", "bool", "none")):
            return path, x
        path.append(str(x))
    return path, None


def validation_error(errors: list[dict]) -> ApiError:
    """pydantic errors -> one 400 naming the first offending field."""
    err = errors[0]
    path, member = _field_path(err.get("loc", ()))
    param = ".".join(path) or None
    if err.get("type") == "missing":
        return ApiError(400, f"missing required field {param!r}", param, "missing")
    if member is not None:  # a union: say which forms are accepted
        forms = [m for e in errors for p, m in [_field_path(e.get("loc", ()))] if p == path and m]
        return ApiError(400, f"{param}: give a {' or a '.join(dict.fromkeys(forms))}", param, "invalid_type")
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return ApiError(400, f"{param}: {msg}" if param else msg, param, err.get("type"))
