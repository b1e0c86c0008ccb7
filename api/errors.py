"""Every error a user sees is ``{"error": {"code", "message", "param"}}``, with a stable
code. Store errors map to HTTP statuses here; pydantic's error types map to a few codes."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from store.errors import Conflict, InvalidRequest, NotFound, QuernError, QueueFull, QueueUnavailable

STATUS_BY_ERROR: dict[type[QuernError], int] = {
    InvalidRequest: 400, NotFound: 404, Conflict: 409, QueueFull: 429, QueueUnavailable: 503,
}
# pydantic error type -> our code; custom error types (PydanticCustomError) pass through
CODE_BY_PYDANTIC_TYPE = {
    "missing": "missing_field",
    "extra_forbidden": "unknown_field",
    "json_invalid": "invalid_json",
    "greater_than": "out_of_range", "greater_than_equal": "out_of_range",
    "less_than": "out_of_range", "less_than_equal": "out_of_range",
    "too_long": "invalid_length", "too_short": "invalid_length",
    "string_too_long": "invalid_length", "string_too_short": "invalid_length",
}
GENERIC_TYPES = {"value_error", "literal_error", "enum", "assertion_error"}


class ApiError(QuernError):
    """An error decided in api/ itself (authentication, the HTTP envelope)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(code, message, param)
        self.status = status
        self.headers = headers


class BodyTooLarge(StarletteHTTPException):
    def __init__(self, code: str, limit: int, param: str | None):
        super().__init__(413, f"the request body is larger than {limit} bytes")
        self.code = code
        self.param = param


def error_response(status: int, code: str, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "param": param}},
                          status_code=status, headers=headers)


def _validation_code(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind in CODE_BY_PYDANTIC_TYPE:
        return CODE_BY_PYDANTIC_TYPE[kind]
    if kind.endswith(("_type", "_parsing")) or kind in ("model_attributes_type",):
        return "invalid_type"
    if kind in GENERIC_TYPES or kind.startswith(("url_", "literal", "enum")):
        return "invalid_value"
    return kind  # a PydanticCustomError's own type, e.g. missing_prompt


def _validation_param(error: dict[str, Any]) -> str | None:
    ctx = error.get("ctx") or {}
    if isinstance(ctx.get("param"), str):
        return ctx["param"]
    loc = [str(p) for p in error.get("loc", ())]
    if loc and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    if error["type"] == "json_invalid":
        return None
    return ".".join(loc) or None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(QuernError)
    async def quern_error(_: Request, exc: QuernError) -> JSONResponse:
        if isinstance(exc, ApiError):
            return error_response(exc.status, exc.code, exc.message, exc.param, exc.headers)
        headers = ({"Retry-After": str(exc.retry_after_s)} if isinstance(exc, QueueFull)
                   else None)
        status = next(s for cls, s in STATUS_BY_ERROR.items() if isinstance(exc, cls))
        return error_response(status, exc.code, exc.message, exc.param, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        if first["type"] == "json_invalid":
            message = f"the body is not valid JSON: {(first.get('ctx') or {}).get('error')}"
        param = _validation_param(first)
        if param:
            message = f"{param}: {message}"
        return error_response(400, _validation_code(first), message, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc, BodyTooLarge):
            return error_response(413, exc.code, str(exc.detail), exc.param)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), None, exc.headers)
