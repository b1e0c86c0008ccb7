"""Errors store functions raise for callers to show. ``code`` is stable; ``param`` names the
field at fault. api/ maps each class to an HTTP status."""

from __future__ import annotations


class QuernError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


class InvalidRequest(QuernError):
    pass


class NotFound(QuernError):
    pass


class Conflict(QuernError):
    pass


class QueueFull(QuernError):
    def __init__(self, code: str, message: str, retry_after_s: int, param: str | None = None):
        super().__init__(code, message, param)
        self.retry_after_s = retry_after_s


class QueueUnavailable(QuernError):
    pass
