"""What the worker does to job rows. Every write is guarded by the job's status, so a
redelivered message (acks late), a duplicate, or the reconciler's re-send can never write a
result twice, revive a cancelled job or double-count a batch.

Per message ``{"job_ids": [...]}`` the worker:

1. ``claim_jobs(session, job_ids, settings)`` -> the jobs to run (queued or running ->
   running, attempts + 1); ids cancelled or finished meanwhile are left out, and jobs past
   ``max_job_attempts`` deliveries are failed with code ``too_many_attempts`` instead.
2. while generating, now and then ``cancelled_job_ids(session, ids)`` -> stop those.
3. ``write_results(session, [JobResult, ...])`` and ``mark_failed(session, [JobFailure,
   ...])``, a few at a time: running -> succeeded / failed, batch counts updated, and a
   batch whose last job finished becomes ``completed`` (or ``cancelled``) with its output
   and error files. Both return the ids actually written; skip webhooks for the others.

Each function commits its own transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.batches import record_outcomes
from store.db import for_update
from store.models import PENDING_JOB_STATUSES, Job
from store.openai_batch import GenerationBody
from store.settings import Settings


@dataclass(frozen=True)
class ClaimedJob:
    id: str
    model: str
    endpoint: str  # /v1/chat/completions or /v1/completions
    body: GenerationBody  # prompt_input(), max_output_tokens, every sampling param
    priority: str  # interactive | batch
    attempt: int  # 1 on first delivery
    tenant_id: str
    batch_id: str | None
    custom_id: str | None
    webhook_url: str | None


@dataclass(frozen=True)
class JobResult:
    job_id: str
    # one per output (n > 1 gives several): {"text", "finish_reason", "num_tokens",
    # optional "logprobs"}, the shape store.openai_batch.completion_body takes
    choices: list[dict[str, Any]]
    prompt_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class JobFailure:
    job_id: str
    code: str  # stable, e.g. "prompt_too_long_for_model", "engine_error"
    message: str
    extra: dict[str, Any] = field(default_factory=dict)


def _lock_pending(session: Session, job_ids: Sequence[str]) -> list[Job]:
    # id order, the order every writer locks in, so concurrent writers cannot deadlock
    return list(session.scalars(for_update(select(Job).where(
        Job.id.in_(sorted(set(job_ids))), Job.status.in_(PENDING_JOB_STATUSES))
        .order_by(Job.id))))


def claim_jobs(session: Session, job_ids: Sequence[str], settings: Settings) -> list[ClaimedJob]:
    """Mark the still-pending jobs running and return them in the order given."""
    jobs = _lock_pending(session, job_ids)
    now = datetime.now(timezone.utc)
    claimed: dict[str, ClaimedJob] = {}
    exhausted = []
    for job in jobs:
        if job.attempts >= settings.max_job_attempts:
            exhausted.append(JobFailure(job.id, "too_many_attempts",
                                        f"the job was delivered {job.attempts} times without "
                                        "finishing"))
            continue
        job.status, job.attempts = "running", job.attempts + 1
        job.started_at = job.started_at or now
        claimed[job.id] = ClaimedJob(
            id=job.id, model=job.model, endpoint=job.endpoint,
            body=GenerationBody.model_validate(job.request), priority=job.priority,
            attempt=job.attempts, tenant_id=job.tenant_id, batch_id=job.batch_id,
            custom_id=job.custom_id, webhook_url=job.webhook_url)
    session.flush()
    if exhausted:
        _finish_jobs(session, {f.job_id: f for f in exhausted}, jobs)
    session.commit()
    return [claimed[i] for i in dict.fromkeys(job_ids) if i in claimed]


def cancelled_job_ids(session: Session, job_ids: Sequence[str]) -> set[str]:
    """Those of ``job_ids`` that were cancelled (the job, its batch, or by expiry)."""
    return set(session.scalars(select(Job.id).where(Job.id.in_(list(job_ids)),
                                                    Job.status == "cancelled")))


def load_jobs(session: Session, job_ids: Sequence[str]) -> list[Job]:
    """Job rows by id, in the order given; missing ids are left out."""
    rows = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(list(job_ids))))}
    return [rows[i] for i in job_ids if i in rows]


def write_results(session: Session, results: Sequence[JobResult]) -> list[str]:
    """Store finished outputs in one transaction; return the ids written (pending ones)."""
    jobs = _lock_pending(session, [r.job_id for r in results])
    _finish_jobs(session, {r.job_id: r for r in results}, jobs)
    session.commit()
    return [j.id for j in jobs]


def mark_failed(session: Session, failures: Sequence[JobFailure]) -> list[str]:
    """Fail pending jobs with an error code and message; return the ids written."""
    jobs = _lock_pending(session, [f.job_id for f in failures])
    _finish_jobs(session, {f.job_id: f for f in failures}, jobs)
    session.commit()
    return [j.id for j in jobs]


def _finish_jobs(session: Session, outcomes: dict[str, JobResult | JobFailure],
                 jobs: list[Job]) -> None:
    now = datetime.now(timezone.utc)
    per_batch: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for job in jobs:
        outcome = outcomes.get(job.id)
        if outcome is None:
            continue
        job.finished_at = now
        if isinstance(outcome, JobResult):
            first = outcome.choices[0] if outcome.choices else {}
            job.status, job.choices = "succeeded", outcome.choices
            job.output_text, job.finish_reason = first.get("text"), first.get("finish_reason")
            job.prompt_tokens, job.cached_tokens = outcome.prompt_tokens, outcome.cached_tokens
            job.completion_tokens = sum(c.get("num_tokens", 0) for c in outcome.choices)
        else:
            job.status = "failed"
            job.error = {"code": outcome.code, "message": outcome.message, **outcome.extra}
        if job.batch_id is not None:
            per_batch[job.batch_id][0 if isinstance(outcome, JobResult) else 1] += 1
    session.flush()
    record_outcomes(session, {b: (ok, bad) for b, (ok, bad) in per_batch.items()})
