"""/v1/files: uploads for batches, and batch output and error files."""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from api.deps import Caller, caller, db_session, settings
from api.errors import ApiError
from api.schemas import FileDeleted, FileObject
from api.upload import MAX_FIELD_BYTES, MultipartReader, Part
from store import files
from store.settings import Settings

router = APIRouter(prefix="/v1/files", tags=["files"])


@router.post("", response_model=FileObject)
async def upload_file(request: Request, who: Caller = Depends(caller),
                      session: Session = Depends(db_session),
                      config: Settings = Depends(settings)) -> FileObject:
    """multipart/form-data with ``purpose`` ("batch") and ``file``. The file streams into
    storage as it arrives; the transaction commits only once all of it is in."""
    try:
        reader = MultipartReader(request.headers.get("content-type", ""))
    except ValueError as exc:
        raise ApiError(400, "invalid_content_type", str(exc), None) from None
    fields: dict[str, bytes] = {}
    writer: files.FileWriter | None = None
    part: Part | None = None
    pending = bytearray()  # gathered up to a chunk so each DB round trip moves ~1 MiB
    async for body in request.stream():
        for event in reader.feed(body):
            if isinstance(event, Part):
                part = event
                if part.filename is None:
                    continue
                if part.name != "file" or writer is not None:
                    raise ApiError(400, "unexpected_file", "send exactly one file, as `file`",
                                   part.name)
                if "purpose" in fields:  # refuse before storing anything, when we can
                    _check_purpose(fields["purpose"])
                writer = await run_in_threadpool(files.FileWriter, session, who.tenant_id,
                                                 part.filename or "upload.jsonl",
                                                 config.file_chunk_bytes)
            elif part is None or event is None:
                continue
            elif part.filename is None or writer is None:
                fields[part.name] = fields.get(part.name, b"") + event
                if len(fields[part.name]) > MAX_FIELD_BYTES:
                    raise ApiError(400, "invalid_value", "form field too long", part.name)
            else:
                pending += event
                if len(pending) >= config.file_chunk_bytes:
                    await run_in_threadpool(writer.write, bytes(pending))
                    pending.clear()
    if writer is None:
        raise ApiError(400, "missing_field", "the form has no `file` part", "file")
    purpose = _check_purpose(fields.get("purpose"))
    await run_in_threadpool(writer.write, bytes(pending))
    file = await run_in_threadpool(writer.finish, purpose)
    return FileObject.from_row(file)


def _check_purpose(raw: bytes | None) -> str:
    if raw is None:
        raise ApiError(400, "missing_field", "the form has no `purpose` field", "purpose")
    purpose = raw.decode("utf-8", "replace")
    if purpose not in files.UPLOAD_PURPOSES:
        raise ApiError(400, "invalid_purpose",
                       f"purpose must be one of {', '.join(files.UPLOAD_PURPOSES)}, "
                       f"got {purpose!r}", "purpose")
    return purpose


@router.get("/{file_id}", response_model=FileObject)
def get_file(file_id: str, who: Caller = Depends(caller), session: Session = Depends(db_session),
             config: Settings = Depends(settings)) -> FileObject:
    return FileObject.from_row(files.describe_file(session, who.tenant_id, file_id, config))


@router.get("/{file_id}/content")
def file_content(file_id: str, who: Caller = Depends(caller),
                 session: Session = Depends(db_session),
                 config: Settings = Depends(settings)) -> StreamingResponse:
    file = files.get_file(session, who.tenant_id, file_id)
    # the name is the uploader's: keep it from breaking out of the header
    safe_name = re.sub(r"[^\w.\-]", "_", file.filename)
    return StreamingResponse(files.iter_file_content(file.id, config),
                             media_type="application/jsonl",
                             headers={"Content-Disposition":
                                      f'attachment; filename="{safe_name}"'})


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, who: Caller = Depends(caller),
                session: Session = Depends(db_session)) -> FileDeleted:
    files.delete_file(session, who.tenant_id, file_id)
    return FileDeleted(id=file_id)
