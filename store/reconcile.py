"""The reconciler (DESIGN data flow step 6): re-send the messages of pending jobs that
Redis lost, because Redis restarted, or the API committed a job and then could not queue it
(503 queue_unavailable), or a worker died holding it and its message went with Redis.

One pass looks at pending jobs whose message was sent longer ago than a grace period:

- ``queued`` for ``requeue_after_s``;
- ``running`` for Celery's visibility timeout plus ``reclaim_margin_s``, counting from
  both the last send and the first claim (a worker that long silent is dead; its attempts
  counter fails a job that keeps killing workers, in ``store.worker.claim_jobs``).

A job whose message is still in Redis, waiting in its model's queue or delivered and not yet
acked, is left to Celery: a long backlog is not a lost message, and a job a live worker is
running is not sent to a second one. Every job looked at gets ``enqueued_at = now``, so it is
looked at again only a grace period later. The rest are re-sent with the same contract as the
first send (``store.queue.send_job_ids``), after the new ``enqueued_at`` is committed. Rows
are taken ``FOR UPDATE SKIP LOCKED``, ``reconcile_batch_size`` per transaction, so
reconcilers running at once never take, and send, the same job.

A duplicate that slips through anyway (a message in flight between queue and unacked hash
while Redis is read) is harmless: the worker's writes are guarded by the job's status.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import redis
from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from store import queue
from store.models import PENDING_JOB_STATUSES, Job
from store.settings import Settings

# kombu's Redis transport: sent messages wait in a list named after the queue (priority 0;
# other priority steps in "{queue}\x06\x16{step}"), delivered ones in the "unacked" hash
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (3, 6, 9)
KOMBU_UNACKED_KEY = "unacked"
LRANGE_PAGE = 1000


@dataclass
class ReconcileReport:
    checked: int = 0  # pending jobs not sent for a grace period
    in_redis: int = 0  # of those, still waiting or being worked on: left to Celery
    resent_queued: int = 0
    resent_running: int = 0
    messages: int = 0  # quern.run_jobs messages sent

    @property
    def resent(self) -> int:
        return self.resent_queued + self.resent_running

    def describe(self) -> str:
        return (f"checked {self.checked} pending jobs: {self.in_redis} still in Redis, "
                f"re-sent {self.resent_queued} queued and {self.resent_running} running in "
                f"{self.messages} messages")


def visibility_timeout_s(settings: Settings) -> float:
    """Celery's redelivery timeout for unacked messages, as store.queue configures it."""
    options = queue.celery_app(settings.redis_url).conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", 3600))


def reconcile(session: Session, settings: Settings,
              now: datetime | None = None) -> ReconcileReport:
    """One pass over every stale pending job; commits after each batch of them."""
    now = now or datetime.now(timezone.utc)
    requeue_before = now - timedelta(seconds=settings.requeue_after_s)
    reclaim_before = now - timedelta(seconds=visibility_timeout_s(settings)
                                     + settings.reclaim_margin_s)
    stale = (select(Job.id, Job.model, Job.priority, Job.status)
             .where(Job.status.in_(PENDING_JOB_STATUSES), Job.enqueued_at < requeue_before,
                    or_(Job.status == "queued",
                        and_(Job.enqueued_at < reclaim_before,
                             Job.started_at < reclaim_before)))
             .order_by(Job.enqueued_at).limit(settings.reconcile_batch_size)
             .with_for_update(skip_locked=True))
    report = ReconcileReport()
    client = redis.Redis.from_url(settings.redis_url)
    in_redis = _MessagesInRedis(client)
    try:
        while rows := session.execute(stale).all():
            report.checked += len(rows)
            in_redis.load({row.model for row in rows})
            lost = [row for row in rows if row.id not in in_redis.job_ids]
            report.in_redis += len(rows) - len(lost)
            session.execute(update(Job).where(Job.id.in_([row.id for row in rows]))
                            .values(enqueued_at=now))
            session.commit()  # before sending: a worker must find the row as we left it
            by_queue: dict[tuple[str, str], list[str]] = defaultdict(list)
            for row in lost:
                by_queue[row.model, row.priority].append(row.id)
            for (model, priority), ids in by_queue.items():
                report.messages += queue.send_job_ids(model, priority, ids, settings)
            report.resent_queued += sum(row.status == "queued" for row in lost)
            report.resent_running += sum(row.status == "running" for row in lost)
            if len(rows) < settings.reconcile_batch_size:
                break
    finally:
        session.rollback()  # release the row locks if a Redis read or send failed
        client.close()
    return report


class _MessagesInRedis:
    """The job ids of quern.run_jobs messages in Redis, read once per model per pass."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self.models: set[str] = set()
        self.job_ids: set[str] = set()

    def load(self, models: Iterable[str]) -> None:
        new = sorted(set(models) - self.models)
        if not new:
            return
        # the unacked hash before and after the lists: a message a worker takes meanwhile
        # moves from one to the other
        self._add(self.client.hvals(KOMBU_UNACKED_KEY), unacked=True)
        for model in new:
            for priority in queue.PRIORITIES:
                name = queue.queue_name(model, priority)
                for key in (name, *(f"{name}{KOMBU_PRIORITY_SEP}{s}"
                                    for s in KOMBU_PRIORITY_STEPS)):
                    self._add_list(key)
        self._add(self.client.hvals(KOMBU_UNACKED_KEY), unacked=True)
        self.models.update(new)

    def _add_list(self, key: str) -> None:
        start = 0
        while page := self.client.lrange(key, start, start + LRANGE_PAGE - 1):
            self._add(page)
            start += LRANGE_PAGE

    def _add(self, raws: Iterable[bytes], *, unacked: bool = False) -> None:
        for raw in raws:
            try:
                envelope = json.loads(raw)
                if unacked:  # [message, exchange, routing_key]
                    envelope = envelope[0]
                if envelope["headers"]["task"] != queue.RUN_JOBS_TASK:
                    continue
                body = envelope["body"]
                if envelope.get("properties", {}).get("body_encoding") == "base64":
                    body = base64.b64decode(body)
                _args, kwargs, _embed = json.loads(body)
                self.job_ids.update(kwargs.get("job_ids", []))
            except (ValueError, KeyError, TypeError, IndexError):
                continue  # not a message of ours
