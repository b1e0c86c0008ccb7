"""The reconciler re-sends pending jobs whose messages Redis lost, once, and nothing else."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import redis
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect, pool
from sqlalchemy.orm import Session

from store.db import sessionmaker_for
from store.migrate import downgrade, upgrade
from store.models import Job
from store.queue import PRIORITIES, queue_name
from store.reconcile import ReconcileReport, reconcile, visibility_timeout_s
from store.settings import Settings
from store.worker import JobResult, claim_jobs, write_results
from tests.api.conftest import chat_job, queued_messages


def later(seconds: float) -> datetime:
    return datetime.now(timezone.utc) + timedelta(seconds=seconds)


def submit(client: TestClient, auth: dict, model: str) -> str:
    response = client.post("/v1/jobs", json=chat_job(model), headers=auth)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def sent(redis_client: redis.Redis, model: str) -> Counter[str]:
    """How many waiting messages name each job id, over every queue of the test models."""
    counts: Counter[str] = Counter()
    for m in (model, model + "-b"):
        for priority in PRIORITIES:
            for message in queued_messages(redis_client, queue_name(m, priority)):
                counts.update(message["kwargs"]["job_ids"])
    return counts


def lose_messages(redis_client: redis.Redis, model: str) -> None:
    for priority in PRIORITIES:
        redis_client.delete(queue_name(model, priority))


def test_a_lost_message_is_resent_after_the_grace_period_and_not_before(
        client: TestClient, auth: dict, model: str, session: Session,
        redis_client: redis.Redis, base_settings: Settings) -> None:
    job_id = submit(client, auth, model)
    lose_messages(redis_client, model)

    early = reconcile(session, base_settings, now=later(base_settings.requeue_after_s - 30))
    assert sent(redis_client, model)[job_id] == 0 and isinstance(early, ReconcileReport)

    report = reconcile(session, base_settings, now=later(base_settings.requeue_after_s + 1))
    assert sent(redis_client, model)[job_id] == 1
    assert report.resent_queued >= 1 and report.messages >= 1
    assert claim_jobs(session, [job_id], base_settings)[0].id == job_id


def test_a_job_still_waiting_in_its_queue_is_not_resent(
        client: TestClient, auth: dict, model: str, session: Session,
        redis_client: redis.Redis, base_settings: Settings) -> None:
    job_id = submit(client, auth, model)
    now = later(base_settings.requeue_after_s + 1)

    report = reconcile(session, base_settings, now=now)

    assert sent(redis_client, model)[job_id] == 1  # the original message only
    assert report.in_redis >= 1
    assert session.get_one(Job, job_id, populate_existing=True).enqueued_at == now


def test_a_running_job_is_resent_only_once_its_claim_is_past_the_visibility_timeout(
        client: TestClient, auth: dict, model: str, session: Session,
        redis_client: redis.Redis, base_settings: Settings) -> None:
    job_id = submit(client, auth, model)
    claim_jobs(session, [job_id], base_settings)
    lose_messages(redis_client, model)  # its worker died, then Redis restarted

    reconcile(session, base_settings, now=later(base_settings.requeue_after_s + 1))
    assert sent(redis_client, model)[job_id] == 0  # a live worker may still be running it

    dead = visibility_timeout_s(base_settings) + base_settings.reclaim_margin_s + 1
    report = reconcile(session, base_settings, now=later(dead))
    assert sent(redis_client, model)[job_id] == 1 and report.resent_running >= 1
    assert claim_jobs(session, [job_id], base_settings)[0].attempt == 2


def test_a_running_job_whose_message_a_worker_holds_is_not_resent(
        client: TestClient, auth: dict, model: str, session: Session,
        redis_client: redis.Redis, base_settings: Settings) -> None:
    job_id = submit(client, auth, model)
    queue = queue_name(model, "interactive")
    raw = redis_client.rpop(queue)  # delivered to a worker: kombu keeps it in "unacked"
    claim_jobs(session, [job_id], base_settings)
    tag = f"test-{uuid.uuid4()}"
    redis_client.hset("unacked", tag, json.dumps([json.loads(raw), "", queue]))
    try:
        dead = visibility_timeout_s(base_settings) + base_settings.reclaim_margin_s + 1
        report = reconcile(session, base_settings, now=later(dead))
    finally:
        redis_client.hdel("unacked", tag)
    assert sent(redis_client, model)[job_id] == 0 and report.in_redis >= 1


def test_finished_and_cancelled_jobs_are_never_resent(
        client: TestClient, auth: dict, model: str, session: Session,
        redis_client: redis.Redis, base_settings: Settings) -> None:
    done, cancelled = submit(client, auth, model), submit(client, auth, model)
    claim_jobs(session, [done], base_settings)
    write_results(session, [JobResult(done, [{"text": "hi", "finish_reason": "stop",
                                              "num_tokens": 1}], prompt_tokens=1)])
    assert client.post(f"/v1/jobs/{cancelled}/cancel", headers=auth).status_code == 200
    lose_messages(redis_client, model)

    reconcile(session, base_settings, now=later(10 * visibility_timeout_s(base_settings)))

    counts = sent(redis_client, model)
    assert counts[done] == 0 and counts[cancelled] == 0


def test_two_reconcilers_at_once_send_each_job_once(
        client: TestClient, new_key: Callable[[], dict[str, str]], model: str,
        redis_client: redis.Redis, base_settings: Settings) -> None:
    auth = new_key()
    ids = [submit(client, auth, model) for _ in range(24)]
    lose_messages(redis_client, model)
    settings = base_settings.model_copy(update={"reconcile_batch_size": 3})
    now = later(settings.requeue_after_s + 1)
    make_session = sessionmaker_for(settings.database_url)
    barrier = threading.Barrier(2)
    reports: list[ReconcileReport] = []

    def run() -> None:
        with make_session() as own:
            barrier.wait()
            reports.append(reconcile(own, settings, now=now))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    counts = sent(redis_client, model)
    assert [counts[i] for i in ids] == [1] * len(ids)
    assert set(counts.values()) == {1}
    assert sum(r.resent for r in reports) == sum(counts.values())


def test_the_api_maintenance_sweep_resends_lost_messages(
        make_client: Callable[..., TestClient], auth: dict, model: str,
        redis_client: redis.Redis) -> None:
    with make_client(maintenance_interval_s=0.1, requeue_after_s=1.0) as swept:
        job_id = submit(swept, auth, model)
        lose_messages(redis_client, model)
        deadline = time.monotonic() + 15
        while not sent(redis_client, model)[job_id] and time.monotonic() < deadline:
            time.sleep(0.1)
    assert sent(redis_client, model)[job_id] >= 1


def test_the_enqueued_at_migration_goes_down_and_up(scratch_db: str) -> None:
    def job_columns() -> set[str]:
        engine = create_engine(scratch_db, poolclass=pool.NullPool)
        try:
            return {c["name"] for c in inspect(engine).get_columns("jobs")}
        finally:
            engine.dispose()

    upgrade("head", scratch_db)
    assert "enqueued_at" in job_columns()
    downgrade("0001", scratch_db)
    assert "enqueued_at" not in job_columns()
    upgrade("head", scratch_db)
    assert "enqueued_at" in job_columns()
