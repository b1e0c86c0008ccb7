"""Caps request bodies as they stream in (a declared Content-Length is refused before any
byte is read), with a larger cap for file uploads."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import BodyTooLarge, error_response


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, default_limit: int, upload_paths: tuple[str, ...],
                 upload_limit: int):
        self.app = app
        self.default_limit = default_limit
        self.upload_paths = upload_paths
        self.upload_limit = upload_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = scope["path"] in self.upload_paths
        limit = self.upload_limit if upload else self.default_limit
        code, param = ("file_too_large", "file") if upload else ("body_too_large", None)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            response = error_response(413, code, f"the request body is larger than {limit} "
                                                 "bytes", param)
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(code, limit, param)
            return message

        await self.app(scope, limited_receive, send)
