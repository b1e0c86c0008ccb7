"""Files: uploads kept in Postgres as ~1 MiB ``file_chunks`` rows (written as the upload
streams in, so no process ever holds a whole file), and batch output/error files, which
are generated from job rows, in input order, whenever they are read."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import orjson
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from store.db import session_scope
from store.errors import NotFound
from store.models import File, FileChunk, Job
from store.openai_batch import completion_body, error_line, output_line
from store.settings import Settings

UPLOAD_PURPOSES = ("batch",)
LINES_PER_PIECE = 256  # output lines joined per streamed piece: few syscalls, little memory


class FileWriter:
    """Receives an upload's bytes in any pieces and stores them in fixed-size chunks."""

    def __init__(self, session: Session, tenant_id: str, filename: str, chunk_bytes: int):
        self.session = session
        self.chunk_bytes = chunk_bytes
        self.file = File(tenant_id=tenant_id, purpose="batch", filename=filename[:255], bytes=0,
                         kind="upload")
        session.add(self.file)
        session.flush()
        self._buffer = bytearray()
        self._next_idx = 0

    def write(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= self.chunk_bytes:
            self._store(bytes(self._buffer[:self.chunk_bytes]))
            del self._buffer[:self.chunk_bytes]

    def _store(self, data: bytes) -> None:
        self.session.execute(FileChunk.__table__.insert().values(
            file_id=self.file.id, idx=self._next_idx, data=data))
        self._next_idx += 1
        self.file.bytes = (self.file.bytes or 0) + len(data)

    def finish(self, purpose: str) -> File:
        """Store what is left and commit the file."""
        if self._buffer:
            self._store(bytes(self._buffer))
            self._buffer.clear()
        self.file.purpose = purpose
        self.session.commit()
        return self.file


def get_file(session: Session, tenant_id: str, file_id: str,
             param: str = "file_id") -> File:
    file = session.scalars(select(File).where(File.id == file_id,
                                              File.tenant_id == tenant_id)).one_or_none()
    if file is None:
        raise NotFound("file_not_found", f"no file {file_id!r}", param)
    return file


def describe_file(session: Session, tenant_id: str, file_id: str,
                  settings: Settings) -> File:
    """The file, with the size of a generated file measured (once) if not yet known."""
    file = get_file(session, tenant_id, file_id)
    if file.bytes is None:
        size = sum(len(piece) for piece in iter_file_content(file.id, settings))
        session.execute(update(File).where(File.id == file.id).values(bytes=size))
        session.commit()
        file.bytes = size
    return file


def delete_file(session: Session, tenant_id: str, file_id: str) -> None:
    file = get_file(session, tenant_id, file_id)
    session.execute(delete(File).where(File.id == file.id))  # chunks go by ON DELETE CASCADE
    session.commit()


def iter_file_content(file_id: str, settings: Settings) -> Iterator[bytes]:
    """The file's bytes, in pieces. Opens its own session: it outlives the request's."""
    with session_scope(settings) as session:
        file = session.get_one(File, file_id)
        if file.kind == "upload":
            yield from session.scalars(select(FileChunk.data).where(FileChunk.file_id == file_id)
                                       .order_by(FileChunk.idx)
                                       .execution_options(yield_per=1))
        else:
            yield from _generated_lines(session, file.batch_id or "", file.kind)


def _generated_lines(session: Session, batch_id: str, kind: str) -> Iterator[bytes]:
    wanted = ["succeeded"] if kind == "output" else ["failed", "cancelled"]
    rows = session.scalars(select(Job).where(Job.batch_id == batch_id, Job.status.in_(wanted))
                           .order_by(Job.line_no)
                           .execution_options(yield_per=LINES_PER_PIECE))
    piece: list[bytes] = []
    for job in rows:
        line = result_line(job)
        piece.append(orjson.dumps(line) + b"\n")
        if len(piece) >= LINES_PER_PIECE:
            yield b"".join(piece)
            piece.clear()
        session.expunge(job)  # keep the identity map from growing with the file
    if piece:
        yield b"".join(piece)


def result_line(job: Job) -> dict:
    """One OpenAI Batch output or error line for a finished job. The line id derives from
    the job id so that the file reads the same every time."""
    if job.status == "succeeded":
        body = completion_body(job.endpoint, request_id=job.id, model=job.model,
                               created=_epoch(job.finished_at), choices=job.choices or [],
                               prompt_tokens=job.prompt_tokens or 0,
                               cached_tokens=job.cached_tokens or 0)
        line = output_line(job.custom_id or "", request_id=job.id, body=body)
    else:
        error = job.error or {"code": job.status, "message": f"the request {job.status}"}
        line = error_line(job.custom_id, error.get("code", "failed"), error.get("message", ""))
    line["id"] = "batch_req_" + job.id.removeprefix("job_")
    return line


def _epoch(moment: datetime | None) -> int:
    return int(moment.timestamp()) if moment else 0
