"""The Celery message contract between the API (producer) and the worker (consumer).

Task ``quern.run_jobs`` (``RUN_JOBS_TASK``), keyword arguments only::

    {"job_ids": ["job_…", …]}      # 1 id for POST /v1/jobs, up to jobs_per_message (64)
                                   # ids, in input-line order, for a batch

Queues, two per model, in Redis (the broker, ``QUERN_REDIS_URL``)::

    quern.{model}.interactive      # POST /v1/jobs with priority "interactive" (the default)
    quern.{model}.batch            # POST /v1/jobs with priority "batch", and every batch line

A worker serving ``model`` consumes both and drains ``interactive`` first. Messages carry
only ids: the request lives in the ``jobs`` row, which the worker claims with
``store.worker.claim_jobs`` (rows cancelled or finished meanwhile are skipped), so a lost or
duplicated message is harmless. Messages are sent only after the transaction that wrote the
rows has committed, so a worker never receives an id it cannot read.

The Celery app here is configured for both sides (acks late, prefetch 1, a visibility
timeout longer than a chunk takes); the worker may import it and register its task on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import lru_cache
from itertools import islice

from celery import Celery

from store.settings import Settings, get_settings

RUN_JOBS_TASK = "quern.run_jobs"
PRIORITIES = ("interactive", "batch")


def queue_name(model: str, priority: str) -> str:
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}")
    return f"quern.{model}.{priority}"


@lru_cache(maxsize=8)
def celery_app(redis_url: str) -> Celery:
    app = Celery("quern", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # a chunk of 64 requests finishes in minutes; redelivery only after an hour
        broker_transport_options={"visibility_timeout": 3600},
        # fail fast when Redis is down rather than hold an HTTP request for seconds
        broker_connection_retry=False,
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0,
                                   "interval_step": 0.2, "interval_max": 0.5},
    )
    return app


def chunked(ids: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(ids)
    while chunk := list(islice(it, size)):
        yield chunk


def send_job_ids(model: str, priority: str, job_ids: Iterable[str],
                 settings: Settings | None = None) -> int:
    """Send ``job_ids`` as ``quern.run_jobs`` messages of up to jobs_per_message ids each.
    Returns the number of messages sent. Call only after the rows are committed."""
    settings = settings or get_settings()
    app = celery_app(settings.redis_url)
    queue = queue_name(model, priority)
    sent = 0
    with app.producer_or_acquire() as producer:  # one connection for the whole batch
        for chunk in chunked(job_ids, settings.jobs_per_message):
            app.send_task(RUN_JOBS_TASK, kwargs={"job_ids": chunk}, queue=queue,
                          routing_key=queue, producer=producer)
            sent += 1
    return sent
