"""The worker: jobs claimed from real Postgres rows, run on one engine host (a tiny random
model), results written once, progress on real Redis pub/sub, a real Celery worker
consuming messages sent as the API sends them, and signed webhooks to a local server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import psycopg
import pytest
import redis
from celery.contrib.testing.worker import start_worker

from store.db import engine_for, sessionmaker_for
from store.jobs import cancel_job, submit_job
from store.migrate import upgrade
from store.models import Job
from store.openai_batch import GenerationBody
from store.queue import queue_name
from store.settings import Settings
from store.tenants import create_api_key
from worker.celery_app import worker_app, worker_queues
from worker.engine_host import EngineHost
from worker.publish import RedisPublisher, channel, snapshot_key
from worker.tasks import JobRunner, run_jobs
from worker.webhooks import WebhookSender, WebhookSettings, is_deliverable

SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
SHARED_PREFIX = "a shared prefix for tenants: zebra quartz vexing jumbo "  # 48 tokens
TOO_LONG = "xyz " * 100  # 400 tokens, past max_model_len
WEBHOOK_KEY = b"quern-test-webhook-key-32-bytes!"


@pytest.fixture(scope="module")
def model() -> str:
    return f"test-worker-{uuid.uuid4().hex[:8]}"  # queue names of this run alone


@pytest.fixture(scope="module")
def settings(model: str) -> Iterator[Settings]:
    """A fresh database of this run's own, migrated by Alembic (as tests/api make theirs)."""
    name = f"quern_test_worker_{uuid.uuid4().hex[:10]}"
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade("head", url)
        yield Settings(database_url=url, redis_url=REDIS_URL, models=[model],
                       max_prompt_chars=5000, jobs_per_message=4)
    finally:
        engine_for(url).dispose()
        with psycopg.connect(SERVER_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def redis_client(model: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    for key in client.scan_iter(match=f"*{model}*"):  # snapshots expire on their own
        client.delete(key)
    client.close()


@pytest.fixture(autouse=True)
def empty_queues(redis_client: redis.Redis, model: str) -> None:
    for priority in ("interactive", "batch"):
        redis_client.delete(queue_name(model, priority))


@pytest.fixture(scope="module")
def host(tiny_engine, redis_client: redis.Redis) -> Iterator[EngineHost]:
    engine, _ = tiny_engine("llama", num_kv_blocks=128, max_model_len=256)
    publisher = RedisPublisher(redis_client, snapshot_ttl_s=60).start()
    engine_host = EngineHost(engine, publisher.publish, publish_interval_s=0.1).start()
    yield engine_host
    engine_host.stop()
    publisher.close()


def new_tenant(settings: Settings) -> str:
    with sessionmaker_for(settings.database_url)() as s:
        tenant, _ = create_api_key(s, f"tenant-{uuid.uuid4().hex[:10]}")
        s.commit()
        return tenant.id


@pytest.fixture
def tenant(settings: Settings) -> str:
    return new_tenant(settings)


def submit(settings: Settings, tenant_id: str, prompt: str = "the quick brown fox", *,
           priority: str = "interactive", webhook_url: str | None = None, **body) -> str:
    """A queued job row and its Celery message, exactly as POST /v1/jobs makes them."""
    body = GenerationBody(model=settings.models[0], prompt=prompt,
                          **{"max_tokens": 8, "temperature": 0, "ignore_eos": True, **body})
    with sessionmaker_for(settings.database_url)() as s:
        job, _ = submit_job(s, tenant_id, body, priority=priority, settings=settings,
                            webhook_url=webhook_url)
        return job.id


def row(settings: Settings, job_id: str) -> Job:
    with sessionmaker_for(settings.database_url)() as s:
        return s.get_one(Job, job_id)


def test_jobs_succeed_with_text_finish_reason_and_tenant_scoped_cached_tokens(settings, host,
                                                                              tenant):
    first = submit(settings, tenant, SHARED_PREFIX + "one")
    assert run_jobs([first], host=host, settings=settings).succeeded == [first]
    same_tenant = submit(settings, tenant, SHARED_PREFIX + "two")
    other_tenant = submit(settings, new_tenant(settings), SHARED_PREFIX + "two")

    report = run_jobs([same_tenant, other_tenant], host=host, settings=settings)

    assert sorted(report.succeeded) == sorted([same_tenant, other_tenant])
    for job_id in (first, same_tenant, other_tenant):
        job = row(settings, job_id)
        assert job.status == "succeeded" and job.attempts == 1
        assert job.output_text and job.output_text == job.choices[0]["text"]
        assert job.finish_reason == "length" and job.completion_tokens == 8
        assert job.prompt_tokens > 48
    assert row(settings, same_tenant).cached_tokens >= 32  # the prefix's full blocks
    assert row(settings, other_tenant).cached_tokens == 0  # cache_salt = tenant


def test_redelivered_message_writes_nothing_the_second_time(settings, host, tenant):
    job_id = submit(settings, tenant)
    run_jobs([job_id], host=host, settings=settings)
    before = row(settings, job_id)

    again = run_jobs([job_id], host=host, settings=settings)

    assert again.claimed == [] and again.succeeded == []
    after = row(settings, job_id)
    assert (after.attempts, after.finished_at, after.output_text) == \
        (before.attempts, before.finished_at, before.output_text)


def test_message_redelivered_while_its_job_runs_shares_the_run_and_writes_once(settings, host,
                                                                             tenant):
    job_id = submit(settings, tenant, max_tokens=128)
    reports = []
    deliveries = [threading.Thread(target=lambda: reports.append(
        run_jobs([job_id], host=host, settings=settings))) for _ in range(2)]
    for t in deliveries:
        t.start()
    for t in deliveries:
        t.join(20)

    assert sorted(len(r.succeeded) for r in reports) == [0, 1]
    assert not any(r.failed for r in reports)
    job = row(settings, job_id)
    assert job.status == "succeeded" and job.attempts == 2 and job.completion_tokens == 128


def first_message(pubsub: redis.client.PubSub, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if msg is not None:
            return json.loads(msg["data"])
    raise AssertionError("no message published")


def test_cancelled_job_is_aborted_in_the_engine_and_not_overwritten(settings, host, tenant,
                                                                   redis_client):
    doomed = submit(settings, tenant, max_tokens=240)
    survivor = submit(settings, tenant)
    pubsub = redis_client.pubsub()
    pubsub.subscribe(channel(doomed))
    reports = []
    runner = threading.Thread(target=lambda: reports.append(run_jobs(
        [doomed, survivor], host=host, settings=settings, cancel_poll_s=0.05)))
    runner.start()
    first_message(pubsub)  # generating
    with sessionmaker_for(settings.database_url)() as s:
        cancel_job(s, tenant, doomed)
    runner.join(20)
    pubsub.close()

    assert reports[0].cancelled == [doomed] and reports[0].succeeded == [survivor]
    job = row(settings, doomed)
    assert job.status == "cancelled" and job.error["code"] == "cancelled"
    assert job.output_text is None and job.completion_tokens is None
    snapshot = json.loads(redis_client.get(snapshot_key(doomed)))["outputs"][0]
    assert snapshot["finish_reason"] == "abort" and snapshot["finished"]
    assert not host.engine.has_unfinished_requests()


def test_prompt_too_long_fails_that_job_and_the_others_succeed(settings, host, tenant):
    ok_before, too_long, ok_after = (submit(settings, tenant), submit(settings, tenant, TOO_LONG),
                                     submit(settings, tenant))

    report = run_jobs([ok_before, too_long, ok_after], host=host, settings=settings)

    assert report.failed == [too_long]
    failed = row(settings, too_long)
    assert failed.status == "failed" and failed.error["code"] == "context_length_exceeded"
    assert "maximum context length" in failed.error["message"]
    assert all(row(settings, j).status == "succeeded" for j in (ok_before, ok_after))


def test_subscriber_gets_coalesced_deltas_adding_up_to_the_text_and_a_snapshot(
        settings, host, tenant, redis_client):
    job_id = submit(settings, tenant, max_tokens=64)
    pubsub = redis_client.pubsub()
    pubsub.subscribe(channel(job_id))

    run_jobs([job_id], host=host, settings=settings)

    messages = []
    while not messages or not messages[-1]["finished"]:
        messages.append(first_message(pubsub))
    pubsub.close()
    job = row(settings, job_id)
    assert "".join(m["delta"] for m in messages) == job.output_text
    offsets = [m["offset"] for m in messages]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert messages[-1]["finish_reason"] == "length"
    assert {m["job_id"] for m in messages} == {job_id} and {m["index"] for m in messages} == {0}
    assert len(messages) in range(2, job.completion_tokens // 2 + 1)  # coalesced, not one per token
    snapshot = json.loads(redis_client.get(snapshot_key(job_id)))
    assert snapshot["outputs"] == [{"index": 0, "text": job.output_text, "finished": True,
                                    "finish_reason": "length"}]
    assert 0 < redis_client.ttl(snapshot_key(job_id)) <= 60


def wait_for(settings: Settings, job_ids: list[str], timeout: float = 30.0) -> list[Job]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [row(settings, j) for j in job_ids]
        if all(j.status not in ("queued", "running") for j in jobs):
            return jobs
        time.sleep(0.1)
    raise AssertionError(f"jobs still pending: {[(j.id, j.status) for j in jobs]}")


def celery_worker(settings: Settings, host: EngineHost, model: str, concurrency: int):
    app = worker_app(settings, JobRunner(host, settings))
    return start_worker(app, pool="threads", concurrency=concurrency,
                        perform_ping_check=False, queues=worker_queues(model),
                        shutdown_timeout=20)


def test_celery_worker_completes_a_job_sent_as_the_api_sends_it(settings, host, tenant, model,
                                                               redis_client):
    job_id = submit(settings, tenant)
    assert redis_client.llen(queue_name(model, "interactive")) == 1

    with celery_worker(settings, host, model, concurrency=2):
        (job,) = wait_for(settings, [job_id])

    assert job.status == "succeeded" and job.completion_tokens == 8
    assert redis_client.llen(queue_name(model, "interactive")) == 0


def test_celery_worker_takes_interactive_jobs_before_batch_jobs(settings, host, tenant, model,
                                                               redis_client):
    batch = [submit(settings, tenant, priority="batch") for _ in range(3)]
    interactive = [submit(settings, tenant) for _ in range(3)]  # sent last
    assert redis_client.llen(queue_name(model, "batch")) == 3

    with celery_worker(settings, host, model, concurrency=1):
        jobs = wait_for(settings, batch + interactive)

    started = {j.id: j.started_at for j in jobs}
    order = sorted(started, key=started.get)
    assert order[:3] == interactive and order[3:] == batch


class _Hooks(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]]
    statuses: list[int]
    arrived: threading.Event

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(self.statuses.pop(0) if self.statuses else 200)
        self.end_headers()
        if not self.statuses:
            self.arrived.set()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hook_server() -> Iterator[type[_Hooks]]:
    handler = type("Hooks", (_Hooks,), {"received": [], "statuses": [503],
                                        "arrived": threading.Event()})
    server = HTTPServer(("127.0.0.1", 0), handler)
    handler.url = f"http://127.0.0.1:{server.server_port}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler
    server.shutdown()
    server.server_close()


def test_webhook_is_retried_and_delivered_with_a_standard_webhooks_signature(
        settings, host, tenant, hook_server):
    secret = "whsec_" + base64.b64encode(WEBHOOK_KEY).decode()
    sender = WebhookSender(WebhookSettings(secret=secret, backoff_s=0.05))
    job_id = submit(settings, tenant, webhook_url=hook_server.url)

    run_jobs([job_id], host=host, settings=settings, webhooks=sender)

    assert hook_server.arrived.wait(10)
    sender.close()
    assert len(hook_server.received) == 2  # a 503, then delivered
    assert len({h["webhook-id"] for h, _ in hook_server.received}) == 1
    for headers, body in hook_server.received:
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
        expected = base64.b64encode(hmac.new(WEBHOOK_KEY, signed, hashlib.sha256).digest())
        assert headers["webhook-signature"] == "v1," + expected.decode()
        assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    event = json.loads(hook_server.received[-1][1])
    job = row(settings, job_id)
    assert event["type"] == "job.succeeded" and event["data"]["id"] == job_id
    assert event["data"]["usage"] == {
        "prompt_tokens": job.prompt_tokens, "completion_tokens": 8,
        "total_tokens": job.prompt_tokens + 8, "cached_tokens": job.cached_tokens}


def test_webhooks_go_only_to_http_urls():
    assert is_deliverable("https://example.com/hook") and is_deliverable("http://127.0.0.1:9/h")
    assert not any(map(is_deliverable, ["ftp://example.com/h", "file:///etc/passwd",
                                        "javascript:alert(1)", "not a url"]))
