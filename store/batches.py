"""OpenAI-style batches: create (status ``validating``), validate the input file line by
line and expand it into job rows (``in_progress``), count outcomes, finalize, cancel, expire.

Validation streams the file chunk by chunk and COPYs job rows as it goes, inside one
transaction: a fault anywhere rolls the rows back and fails the batch, listing every faulty
line. Batch status changes take the batch row lock after the job rows they depend on, the
same order as result writes, so concurrent writers never deadlock or miss the last result.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
from sqlalchemy import Select, exists, func, select, update
from sqlalchemy.orm import Session

from store import queue
from store.db import for_update, raw_connection, session_scope, sessionmaker_for
from store.errors import Conflict, InvalidRequest, NotFound
from store.files import get_file
from store.limits import check_generation
from store.models import PENDING_JOB_STATUSES, Batch, File, FileChunk, Job, new_id
from store.openai_batch import BatchLine, BatchLineError, parse_batch_line
from store.pagination import page
from store.settings import Settings

log = logging.getLogger(__name__)

COMPLETION_WINDOWS = {"24h": timedelta(hours=24)}
FINISHED_BATCH_STATUSES = ("failed", "completed", "expired", "cancelled")
JOB_COLUMNS = ("id", "tenant_id", "batch_id", "line_no", "custom_id", "model", "endpoint",
               "request", "priority", "status")


def create_batch(session: Session, tenant_id: str, *, input_file_id: str, endpoint: str,
                 completion_window: str, metadata: dict[str, str] | None) -> Batch:
    file = get_file(session, tenant_id, input_file_id, param="input_file_id")
    if file.purpose != "batch" or file.kind != "upload":
        raise InvalidRequest("invalid_input_file",
                             f"file {input_file_id!r} has purpose {file.purpose!r}, not 'batch'",
                             "input_file_id")
    now = datetime.now(timezone.utc)
    batch = Batch(tenant_id=tenant_id, input_file_id=input_file_id, endpoint=endpoint,
                  completion_window=completion_window, status="validating", metadata_=metadata,
                  created_at=now, expires_at=now + COMPLETION_WINDOWS[completion_window])
    session.add(batch)
    session.commit()
    return batch


def get_batch(session: Session, tenant_id: str, batch_id: str, *,
              lock: bool = False) -> Batch:
    query = select(Batch).where(Batch.id == batch_id, Batch.tenant_id == tenant_id)
    batch = session.scalars(for_update(query) if lock else query).one_or_none()
    if batch is None:
        raise NotFound("batch_not_found", f"no batch {batch_id!r}", "batch_id")
    return batch


def list_batches(session: Session, tenant_id: str, *, after: str | None = None,
                 limit: int = 20) -> tuple[list[Batch], bool]:
    return page(session, select(Batch).where(Batch.tenant_id == tenant_id), Batch, tenant_id,
                after, limit)


def cancel_batch(session: Session, tenant_id: str, batch_id: str) -> Batch:
    """Cancel every pending job of the batch. A batch still validating turns ``cancelling``
    and its validator finishes the cancellation."""
    batch = get_batch(session, tenant_id, batch_id)
    if batch.status in ("cancelling", "cancelled"):
        return batch
    if batch.status in FINISHED_BATCH_STATUSES or batch.status == "finalizing":
        raise Conflict("batch_not_cancellable", f"the batch is already {batch.status}",
                       "batch_id")
    _cancel_pending_jobs(session, batch.id, {"code": "batch_cancelled",
                                             "message": "the batch was cancelled"})
    batch = get_batch(session, tenant_id, batch_id, lock=True)
    now = datetime.now(timezone.utc)
    if batch.status == "validating":
        batch.status, batch.cancelling_at = "cancelling", now
    elif batch.status == "in_progress":
        batch.cancelling_at = now
        _finish(session, batch, "cancelled", now)
    session.commit()
    return batch


def _cancel_pending_jobs(session: Session, batch_id: str, error: dict[str, str]) -> int:
    # lock in id order, the order result writes lock in
    ids = list(session.scalars(select(Job.id).where(
        Job.batch_id == batch_id, Job.status.in_(PENDING_JOB_STATUSES))
        .order_by(Job.id).with_for_update()))  # ids only: nothing held in the session to refresh
    if ids:
        session.execute(update(Job).where(Job.id.in_(ids), Job.status.in_(PENDING_JOB_STATUSES))
                        .values(status="cancelled", error=error, finished_at=func.now()))
    return len(ids)


def record_outcomes(session: Session, outcomes: dict[str, tuple[int, int]]) -> None:
    """Add (succeeded, failed) counts to each batch and finish those with nothing pending.
    Call after the job rows changed, in the same transaction."""
    for batch_id in sorted(outcomes):
        succeeded, failed = outcomes[batch_id]
        batch = session.scalars(_locked_batch(batch_id)).one_or_none()
        if batch is None:
            continue
        batch.completed += succeeded
        batch.failed += failed
        if batch.status in ("in_progress", "cancelling") and not _has_pending_jobs(session,
                                                                                   batch_id):
            end = "cancelled" if batch.status == "cancelling" else "completed"
            _finish(session, batch, end, datetime.now(timezone.utc))


def _has_pending_jobs(session: Session, batch_id: str) -> bool:
    return bool(session.scalar(select(exists().where(
        Job.batch_id == batch_id, Job.status.in_(PENDING_JOB_STATUSES)))))


def _finish(session: Session, batch: Batch, status: str, now: datetime) -> None:
    """Move a batch whose jobs are all finished to ``status``, attaching its output and
    error files (generated from the job rows when read)."""
    batch.finalizing_at = now
    counts = dict(session.execute(select(Job.status, func.count()).where(
        Job.batch_id == batch.id).group_by(Job.status)).all())
    if counts.get("succeeded"):
        batch.output_file_id = _generated_file(session, batch, "output").id
    if counts.get("failed") or counts.get("cancelled"):
        batch.error_file_id = _generated_file(session, batch, "error").id
    batch.status = status
    setattr(batch, f"{status}_at", now)


def _generated_file(session: Session, batch: Batch, kind: str) -> File:
    file = File(id=new_id("file-"), tenant_id=batch.tenant_id, purpose="batch_output",
                filename=f"{batch.id}_{kind}.jsonl", bytes=None, kind=kind, batch_id=batch.id)
    session.add(file)
    return file


def expire_batches(session: Session, now: datetime | None = None) -> list[str]:
    """Expire batches past their completion window: pending jobs are cancelled with code
    ``batch_expired`` and the batch keeps what finished. Returns the expired ids."""
    now = now or datetime.now(timezone.utc)
    ids = list(session.scalars(select(Batch.id).where(
        Batch.status.in_(("validating", "in_progress")), Batch.expires_at < now)))
    expired = []
    for batch_id in ids:
        _cancel_pending_jobs(session, batch_id, {"code": "batch_expired",
                                                 "message": "the batch expired before this "
                                                            "request ran"})
        batch = session.scalars(_locked_batch(batch_id)).one()
        if batch.status in ("validating", "in_progress"):
            _finish(session, batch, "expired", now)
            expired.append(batch_id)
        session.commit()
    return expired


def batches_awaiting_validation(session: Session) -> list[str]:
    return list(session.scalars(select(Batch.id).where(
        Batch.status.in_(("validating", "cancelling")), Batch.total == 0)))


# --- validation and expansion -------------------------------------------------------------


class _Validation:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.errors: list[dict[str, Any]] = []
        self.error_count = 0
        self.model: str | None = None
        self.custom_ids: set[str] = set()
        self.lines = 0

    def fail(self, error: BatchLineError) -> None:
        self.error_count += 1
        if len(self.errors) < self.settings.batch_max_errors:
            self.errors.append(error.as_error())


def validate_and_expand(batch_id: str, settings: Settings) -> str | None:
    """Validate a ``validating`` batch's file and turn it into queued jobs, then send their
    messages. Safe to call from several processes: one takes the batch, the others return
    None. Returns the batch's new status."""
    make_session = sessionmaker_for(settings.database_url)
    with make_session() as session:
        # a transaction-scoped advisory lock claims the batch without blocking cancel requests
        if not session.scalar(select(func.pg_try_advisory_xact_lock(_lock_key(batch_id)))):
            return None
        batch = session.get(Batch, batch_id)
        if batch is None or batch.status not in ("validating", "cancelling") or batch.total:
            return None
        if batch.status == "cancelling":
            _finish(session, batch, "cancelled", datetime.now(timezone.utc))
            session.commit()
            return "cancelled"
        tenant_id, endpoint, file_id = batch.tenant_id, batch.endpoint, batch.input_file_id
        check = _Validation(settings)
        _copy_jobs(session, check, tenant_id, batch_id, endpoint, file_id)
        if not check.error_count:
            _check_batch_queue_cap(session, check, tenant_id)
        if check.error_count:
            session.rollback()
            return _fail(session, batch_id, check)
        batch = session.scalars(_locked_batch(batch_id)).one()
        if batch.status == "cancelling":  # cancelled while we validated: keep no jobs
            session.rollback()
            batch = session.scalars(_locked_batch(batch_id)).one()
            _finish(session, batch, "cancelled", datetime.now(timezone.utc))
            session.commit()
            return "cancelled"
        batch.status, batch.in_progress_at = "in_progress", datetime.now(timezone.utc)
        batch.total, batch.model = check.lines, check.model
        session.commit()
        model = batch.model or ""
    _send_batch(batch_id, model, settings)
    return "in_progress"


def _locked_batch(batch_id: str) -> Select[tuple[Batch]]:
    return for_update(select(Batch).where(Batch.id == batch_id))


def _lock_key(batch_id: str) -> int:
    return zlib.crc32(batch_id.encode()) - (1 << 31)  # fits a signed 32-bit int


def _copy_jobs(session: Session, check: _Validation, tenant_id: str, batch_id: str,
               endpoint: str, file_id: str) -> None:
    """Validate every line; while all are valid, COPY each as a queued job row."""
    with raw_connection(session).cursor() as cursor, cursor.copy(
            f"COPY jobs ({', '.join(JOB_COLUMNS)}) FROM STDIN") as copy:
        for line_no, raw in _file_lines(file_id, check.settings):
            if not raw.strip():
                continue
            check.lines += 1
            if check.lines > check.settings.batch_max_lines:
                check.fail(BatchLineError(
                    line_no, "too_many_lines",
                    f"a batch may hold at most {check.settings.batch_max_lines} requests"))
                break
            try:
                line = _validate_line(check, raw, line_no, endpoint)
            except BatchLineError as exc:
                check.fail(exc)
                continue
            if check.error_count:
                continue  # keep validating, to name every faulty line; the rows roll back
            request = orjson.dumps(line.body.model_dump(mode="json", exclude_unset=True))
            copy.write_row((new_id("job_"), tenant_id, batch_id, line_no, line.custom_id,
                            line.body.model, line.url, request.decode(), "batch", "queued"))
    if check.lines == 0 and not check.error_count:
        check.fail(BatchLineError(0, "empty_file", "the input file holds no requests"))


def _validate_line(check: _Validation, raw: bytes, line_no: int, endpoint: str) -> BatchLine:
    line = parse_batch_line(raw, line_no, url_for_all=endpoint)
    try:
        check_generation(line.body, check.settings, param_prefix="body.")
    except InvalidRequest as exc:
        raise BatchLineError(line_no, exc.code, exc.message, exc.param, line.custom_id) from None
    if check.model is None:
        check.model = line.body.model
    elif line.body.model != check.model:
        raise BatchLineError(line_no, "mismatched_model",
                             f"model {line.body.model!r} differs from {check.model!r} on earlier "
                             "lines; a batch runs one model", "body.model", line.custom_id)
    if line.custom_id in check.custom_ids:
        raise BatchLineError(line_no, "duplicate_custom_id",
                             f"custom_id {line.custom_id!r} appears on an earlier line",
                             "custom_id", line.custom_id)
    check.custom_ids.add(line.custom_id)
    return line


def _file_lines(file_id: str, settings: Settings) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) for each line of an uploaded file, streamed chunk by chunk on
    a connection of its own (the other one is busy with COPY)."""
    with session_scope(settings) as reader:
        chunks = reader.scalars(select(FileChunk.data).where(FileChunk.file_id == file_id)
                                .order_by(FileChunk.idx).execution_options(yield_per=1))
        carry = b""
        line_no = 0
        for chunk in chunks:
            lines = (carry + chunk).split(b"\n")
            carry = lines.pop()
            for raw in lines:
                line_no += 1
                yield line_no, raw
        if carry:
            yield line_no + 1, carry


def _check_batch_queue_cap(session: Session, check: _Validation, tenant_id: str) -> None:
    queued = session.scalar(select(func.count()).select_from(Job).where(
        Job.tenant_id == tenant_id, Job.status == "queued", Job.batch_id.is_not(None)))
    cap = check.settings.max_queued_batch_jobs_per_tenant
    if queued > cap:  # this batch's rows are counted too
        check.fail(BatchLineError(0, "queue_limit_exceeded",
                                  f"this batch would leave {queued} batch requests queued; the "
                                  f"limit is {cap}"))


def _fail(session: Session, batch_id: str, check: _Validation) -> str:
    errors = check.errors
    for error in errors:
        if error["line"] == 0:  # about the file, not a line
            error["line"] = None
    if check.error_count > len(errors):
        errors.append({"code": "too_many_errors", "param": None, "line": None,
                       "message": f"{check.error_count - len(errors)} more lines have errors"})
    session.execute(update(Batch).where(Batch.id == batch_id).values(
        status="failed", failed_at=func.now(), errors={"object": "list", "data": errors}))
    session.commit()
    return "failed"


def _send_batch(batch_id: str, model: str, settings: Settings) -> None:
    with session_scope(settings) as session:
        ids = session.scalars(select(Job.id).where(Job.batch_id == batch_id)
                              .order_by(Job.line_no).execution_options(yield_per=4096))
        try:
            queue.send_job_ids(model, "batch", ids, settings)
        except Exception:
            # rows stay queued for the reconciler to re-send; the batch itself is sound
            log.exception("batch %s: could not send its job messages", batch_id)


def run_maintenance(settings: Settings) -> None:
    """What the API runs every few seconds: expire overdue batches and take up batches whose
    validation was interrupted (the process running it died)."""
    with session_scope(settings) as session:
        expire_batches(session)
        waiting = batches_awaiting_validation(session)
    for batch_id in waiting:
        validate_and_expand(batch_id, settings)
