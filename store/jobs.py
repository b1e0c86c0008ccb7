"""Single jobs as the API sees them: submit (idempotent, capped per tenant), read, list,
cancel. Functions that change rows commit, so that callers can send queue messages after."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

import orjson
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from store import queue
from store.batches import record_outcomes
from store.db import for_update
from store.errors import Conflict, NotFound, QueueFull, QueueUnavailable
from store.limits import check_generation
from store.models import PENDING_JOB_STATUSES, Job, new_id
from store.openai_batch import CHAT_URL, COMPLETIONS_URL, GenerationBody
from store.pagination import page
from store.settings import Settings

CANCELLED_ERROR = {"code": "cancelled", "message": "the job was cancelled"}


def request_hash(payload: dict[str, Any]) -> str:
    """A fingerprint of a request, to tell a retry from a different request under the same
    Idempotency-Key."""
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


def endpoint_for(body: GenerationBody) -> str:
    return CHAT_URL if body.messages is not None else COMPLETIONS_URL


def request_json(body: GenerationBody) -> dict[str, Any]:
    """The stored request: what the caller set, so defaults stay the engine's to choose."""
    return body.model_dump(mode="json", exclude_unset=True)


def submit_job(session: Session, tenant_id: str, body: GenerationBody, *, priority: str,
               settings: Settings, webhook_url: str | None = None,
               metadata: dict[str, str] | None = None, idempotency_key: str | None = None,
               ) -> tuple[Job, bool]:
    """Write a queued job and send its message; return (job, created).

    A repeated ``idempotency_key`` with the same request returns the first job (created is
    False) and sends nothing; with a different request it raises Conflict.
    """
    check_generation(body, settings)
    fingerprint = request_hash({"body": request_json(body), "priority": priority,
                                "webhook_url": webhook_url, "metadata": metadata})
    if idempotency_key is not None:
        existing = _by_idempotency_key(session, tenant_id, idempotency_key, fingerprint)
        if existing is not None:
            return existing, False
    _check_queue_cap(session, tenant_id, settings)
    job_id = new_id("job_")
    values = dict(id=job_id, tenant_id=tenant_id, model=body.model, endpoint=endpoint_for(body),
                  request=request_json(body), priority=priority, status="queued",
                  idempotency_key=idempotency_key, request_hash=fingerprint,
                  webhook_url=webhook_url, metadata_=metadata)
    # ON CONFLICT: two concurrent retries with one key must not both create a job
    inserted = session.scalar(
        insert(Job).values(**values)
        .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"],
                                index_where=Job.idempotency_key.is_not(None))
        .returning(Job.id))
    session.commit()
    if inserted is None:
        existing = _by_idempotency_key(session, tenant_id, idempotency_key or "", fingerprint)
        assert existing is not None  # the conflicting row is committed, or we would not conflict
        return existing, False
    job = session.get_one(Job, job_id)
    try:
        queue.send_job_ids(job.model, priority, [job.id], settings)
    except Exception as exc:  # kombu raises several families; all mean "not sent"
        # The row stays queued; re-sending is the reconciler's job, and a retry with the same
        # Idempotency-Key returns this job.
        raise QueueUnavailable("queue_unavailable",
                               f"job {job.id} was saved but could not be queued: {exc}") from exc
    return job, True


def _by_idempotency_key(session: Session, tenant_id: str, key: str,
                        fingerprint: str) -> Job | None:
    job = session.scalars(select(Job).where(Job.tenant_id == tenant_id,
                                            Job.idempotency_key == key)).one_or_none()
    if job is not None and job.request_hash != fingerprint:
        raise Conflict("idempotency_key_reused",
                       "this Idempotency-Key was used with a different request",
                       "Idempotency-Key")
    return job


def _check_queue_cap(session: Session, tenant_id: str, settings: Settings) -> None:
    queued = session.scalar(select(func.count()).select_from(Job).where(
        Job.tenant_id == tenant_id, Job.status == "queued", Job.batch_id.is_(None)))
    if queued >= settings.max_queued_jobs_per_tenant:
        raise QueueFull("queue_full",
                        f"{queued} jobs are already queued; the limit is "
                        f"{settings.max_queued_jobs_per_tenant}",
                        settings.queue_full_retry_after_s)


def get_job(session: Session, tenant_id: str, job_id: str, *, lock: bool = False) -> Job:
    query = select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id)
    job = session.scalars(for_update(query) if lock else query).one_or_none()
    if job is None:
        raise NotFound("job_not_found", f"no job {job_id!r}", "job_id")
    return job


def list_jobs(session: Session, tenant_id: str, *, after: str | None = None, limit: int = 20,
              status: str | None = None, batch_id: str | None = None) -> tuple[list[Job], bool]:
    query = select(Job).where(Job.tenant_id == tenant_id)
    if status is not None:
        query = query.where(Job.status == status)
    if batch_id is not None:
        query = query.where(Job.batch_id == batch_id)
    return page(session, query, Job, tenant_id, after, limit)


def cancel_job(session: Session, tenant_id: str, job_id: str) -> Job:
    """Cancel a queued or running job (the worker sees it through
    ``store.worker.cancelled_job_ids`` and its result write is then refused)."""
    job = get_job(session, tenant_id, job_id, lock=True)
    if job.status == "cancelled":
        return job
    if job.status not in PENDING_JOB_STATUSES:
        raise Conflict("job_not_cancellable", f"the job has already {job.status}", "job_id")
    job.status = "cancelled"
    job.error = CANCELLED_ERROR
    job.finished_at = datetime.now(timezone.utc)
    session.flush()
    if job.batch_id is not None:
        record_outcomes(session, {job.batch_id: (0, 0)})  # it may have been the last one
    session.commit()
    return job
