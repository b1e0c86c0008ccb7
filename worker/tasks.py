"""``quern.run_jobs``: claim the jobs of one message, run them on the engine host, write the
outcomes, then return so that Celery acks the message (acks late) only after the writes.

``run_jobs`` is the plain function (tests call it directly); ``register_task`` binds the
Celery task to it. Every store write is guarded by the job's status, so a redelivered
message writes nothing twice and a cancelled job is never overwritten.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from sqlalchemy.exc import OperationalError

from engine import BATCH, INTERACTIVE, PromptTooLongError, RequestOutput
from store.db import sessionmaker_for
from store.queue import RUN_JOBS_TASK
from store.settings import Settings
from store.worker import (
    ClaimedJob,
    JobFailure,
    JobResult,
    cancelled_job_ids,
    claim_jobs,
    mark_failed,
    write_results,
)
from worker.engine_host import EngineError, EngineHost
from worker.params import logprobs_entries, sampling_params_from_body
from worker.webhooks import WebhookSender, job_event

log = logging.getLogger(__name__)

ENGINE_PRIORITY = {"interactive": INTERACTIVE, "batch": BATCH}


@dataclass
class RunReport:
    """What one message came to; ids listed are those this call wrote (or aborted)."""

    claimed: list[str] = field(default_factory=list)
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # aborted in the engine

    def as_dict(self) -> dict[str, list[str]]:
        return {"claimed": self.claimed, "succeeded": self.succeeded, "failed": self.failed,
                "cancelled": self.cancelled}


def run_jobs(job_ids: Sequence[str], *, host: EngineHost, settings: Settings,
             webhooks: WebhookSender | None = None, cancel_poll_s: float = 1.0) -> RunReport:
    report = RunReport()
    sessions = sessionmaker_for(settings.database_url)
    with sessions() as session:
        jobs = {job.id: job for job in claim_jobs(session, job_ids, settings)}
    report.claimed = list(jobs)
    if not jobs:
        return report

    futures: dict[str, Future[RequestOutput]] = {}
    failures: list[JobFailure] = []
    for job in jobs.values():
        try:
            params = sampling_params_from_body(job.body)
        except ValueError as exc:
            failures.append(JobFailure(job.id, "invalid_request", str(exc)))
            continue
        # cache_salt: one tenant's prompts never hit another tenant's cached blocks
        futures[job.id] = host.submit(job.id, job.body.prompt_input(), params,
                                      priority=ENGINE_PRIORITY[job.priority],
                                      cache_salt=job.tenant_id)

    cancelled = _wait_aborting_cancelled(futures, host, sessions, cancel_poll_s)
    report.cancelled = sorted(cancelled)
    results: list[JobResult] = []
    for job_id, future in futures.items():
        if job_id in cancelled:
            continue
        exc = future.exception()
        if exc is None:
            output = future.result()
            if any(o.finish_reason == "abort" for o in output.outputs):
                continue  # aborted for another delivery of this job, which writes nothing
            results.append(_result(job_id, output))
        else:
            failures.append(_failure(job_id, exc))

    with sessions() as session:
        if results:
            report.succeeded = write_results(session, results)
        if failures:
            report.failed = mark_failed(session, failures)
    if webhooks is not None:
        _queue_webhooks(webhooks, jobs, report, results, failures)
    return report


def _wait_aborting_cancelled(futures: dict[str, Future[RequestOutput]], host: EngineHost,
                             sessions: Any, poll_s: float) -> set[str]:
    """Wait for every future; every ``poll_s`` abort the jobs cancelled meanwhile."""
    cancelled: set[str] = set()
    pending = set(futures.values())
    while pending:
        _, pending = wait(pending, timeout=poll_s)
        running = [i for i, f in futures.items() if not f.done() and i not in cancelled]
        if not running:
            continue
        with sessions() as session:
            newly = cancelled_job_ids(session, running)
        for job_id in newly:
            host.abort(job_id)
        cancelled |= newly
    return cancelled


def _result(job_id: str, output: RequestOutput) -> JobResult:
    choices = [{"text": o.text, "finish_reason": o.finish_reason,
                "num_tokens": len(o.token_ids), "logprobs": logprobs_entries(o.logprobs)}
               for o in output.outputs]
    return JobResult(job_id, choices, prompt_tokens=len(output.prompt_token_ids),
                     cached_tokens=output.num_cached_tokens)


def _failure(job_id: str, exc: BaseException) -> JobFailure:
    if isinstance(exc, (PromptTooLongError, EngineError)):
        return JobFailure(job_id, exc.code, str(exc))
    if isinstance(exc, ValueError):
        return JobFailure(job_id, "invalid_request", str(exc))
    return JobFailure(job_id, "engine_error", f"{type(exc).__name__}: {exc}")


def _queue_webhooks(webhooks: WebhookSender, jobs: dict[str, ClaimedJob], report: RunReport,
                    results: list[JobResult], failures: list[JobFailure]) -> None:
    written_ok, written_bad = set(report.succeeded), set(report.failed)
    for r in results:
        job = jobs[r.job_id]
        if r.job_id in written_ok and job.webhook_url:
            completion = sum(c["num_tokens"] for c in r.choices)
            usage = {"prompt_tokens": r.prompt_tokens, "completion_tokens": completion,
                     "total_tokens": r.prompt_tokens + completion,
                     "cached_tokens": r.cached_tokens}
            webhooks.send(job.webhook_url, _msg_id(job.id), job_event(
                job.id, "succeeded", usage=usage, batch_id=job.batch_id,
                custom_id=job.custom_id))
    for f in failures:
        job = jobs[f.job_id]
        if f.job_id in written_bad and job.webhook_url:
            webhooks.send(job.webhook_url, _msg_id(job.id), job_event(
                job.id, "failed", error={"code": f.code, "message": f.message},
                batch_id=job.batch_id, custom_id=job.custom_id))


def _msg_id(job_id: str) -> str:
    return "msg_" + job_id.removeprefix("job_")  # one final event per job: stable on retries


@dataclass
class JobRunner:
    """What the Celery task needs to call ``run_jobs``."""

    host: EngineHost
    settings: Settings
    webhooks: WebhookSender | None = None
    cancel_poll_s: float = 1.0

    def __call__(self, job_ids: Sequence[str]) -> RunReport:
        return run_jobs(job_ids, host=self.host, settings=self.settings, webhooks=self.webhooks,
                        cancel_poll_s=self.cancel_poll_s)


def register_task(app: Celery, runner: JobRunner) -> None:
    """Bind ``quern.run_jobs`` on ``app`` to ``runner``, replacing an earlier binding."""
    app.tasks.pop(RUN_JOBS_TASK, None)

    # Postgres down: retry (the claim is idempotent) rather than ack a message we dropped
    @app.task(name=RUN_JOBS_TASK, shared=False, autoretry_for=(OperationalError,),
              retry_backoff=True, retry_backoff_max=60, max_retries=10)
    def run_jobs_task(job_ids: list[str]) -> dict[str, list[str]]:
        report = runner(job_ids)
        log.info("run_jobs %s", report.as_dict())
        return report.as_dict()
