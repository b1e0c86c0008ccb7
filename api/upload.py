"""A streaming multipart/form-data reader: the request body is parsed as it arrives and the
file part handed on in pieces, so an upload of any size passes through bounded memory."""

from __future__ import annotations

from dataclasses import dataclass

from python_multipart.multipart import MultipartParser, parse_options_header

MAX_FIELD_BYTES = 1024  # `purpose` and friends are short words


@dataclass
class Part:
    name: str
    filename: str | None


class MultipartReader:
    """Feed body bytes with ``feed``; get back events: a Part when one begins, then its
    data as bytes, then None when it ends."""

    def __init__(self, content_type: str):
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise ValueError("expected a multipart/form-data body with a boundary")
        self._events: list[Part | bytes | None] = []
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin,
            "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": lambda: self._events.append(None),
        })

    def feed(self, data: bytes) -> list[Part | bytes | None]:
        self._parser.write(data)
        events, self._events = self._events, []
        return events

    def _part_begin(self) -> None:
        self._headers = {}

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field = self._header_value = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        filename = options.get(b"filename")
        self._events.append(Part(
            name=options.get(b"name", b"").decode("utf-8", "replace"),
            filename=filename.decode("utf-8", "replace") if filename is not None else None))

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        self._events.append(bytes(data[start:end]))
