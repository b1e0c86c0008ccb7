"""The life of a single job: rows, queue messages, worker writes, cancellation."""

from __future__ import annotations

from collections.abc import Callable

import redis
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from store.models import Job
from store.queue import RUN_JOBS_TASK, queue_name
from store.settings import Settings
from store.worker import JobFailure, JobResult, claim_jobs, mark_failed, write_results
from tests.api.conftest import chat_job, queued_messages


def result(job_id: str, text: str = "Hello!") -> JobResult:
    return JobResult(job_id=job_id, prompt_tokens=7, cached_tokens=3,
                     choices=[{"text": text, "finish_reason": "stop", "num_tokens": 2}])


def test_job_lifecycle_in_rows_and_queue_messages(
        client: TestClient, auth: dict, model: str, session: Session,
        redis_client: redis.Redis, base_settings: Settings) -> None:
    created = client.post("/v1/jobs", json=chat_job(model, temperature=0, max_tokens=16,
                                                    metadata={"run": "1"}), headers=auth)
    assert created.status_code == 202, created.text
    job = created.json()
    assert job["status"] == "queued" and job["priority"] == "interactive"
    assert job["request"]["max_tokens"] == 16 and job["endpoint"] == "/v1/chat/completions"
    row = session.get_one(Job, job["id"])
    assert (row.status, row.model, row.attempts) == ("queued", model, 0)

    messages = queued_messages(redis_client, queue_name(model, "interactive"))
    assert messages == [{"task": RUN_JOBS_TASK, "args": [], "kwargs": {"job_ids": [job["id"]]}}]

    claimed = claim_jobs(session, [job["id"]], base_settings)
    assert [c.id for c in claimed] == [job["id"]]
    assert claimed[0].body.temperature == 0 and claimed[0].body.max_output_tokens == 16
    assert claimed[0].attempt == 1
    running = client.get(f"/v1/jobs/{job['id']}", headers=auth).json()
    assert running["status"] == "running" and running["started_at"] is not None

    assert write_results(session, [result(job["id"])]) == [job["id"]]
    done = client.get(f"/v1/jobs/{job['id']}", headers=auth).json()
    assert done["status"] == "succeeded"
    assert done["output"] == "Hello!" and done["finish_reason"] == "stop"
    assert done["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                             "cached_tokens": 3}
    assert done["finished_at"] >= done["started_at"] >= done["created_at"]
    assert done["error"] is None and done["metadata"] == {"run": "1"}


def test_a_redelivered_result_is_not_written_twice(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    job_id = client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
    claim_jobs(session, [job_id], base_settings)
    assert write_results(session, [result(job_id, "first")]) == [job_id]
    assert claim_jobs(session, [job_id], base_settings) == []  # a redelivered message
    assert write_results(session, [result(job_id, "second")]) == []
    assert mark_failed(session, [JobFailure(job_id, "engine_error", "boom")]) == []
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).json()["output"] == "first"


def test_batch_priority_goes_to_the_batch_queue(
        client: TestClient, auth: dict, model: str, redis_client: redis.Redis) -> None:
    job = client.post("/v1/jobs", json={"model": model, "prompt": "Once", "priority": "batch"},
                      headers=auth).json()
    assert job["endpoint"] == "/v1/completions"
    assert queued_messages(redis_client, queue_name(model, "interactive")) == []
    batch_queue = queued_messages(redis_client, queue_name(model, "batch"))
    assert [m["kwargs"]["job_ids"] for m in batch_queue] == [[job["id"]]]


def test_idempotency_key_returns_the_same_job_and_sends_once(
        client: TestClient, auth: dict, model: str, redis_client: redis.Redis) -> None:
    headers = {**auth, "Idempotency-Key": "order-42"}
    first = client.post("/v1/jobs", json=chat_job(model), headers=headers)
    again = client.post("/v1/jobs", json=chat_job(model), headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(queued_messages(redis_client, queue_name(model, "interactive"))) == 1

    different = client.post("/v1/jobs", json=chat_job(model, temperature=0.5), headers=headers)
    assert different.status_code == 409
    assert different.json()["error"]["code"] == "idempotency_key_reused"
    assert different.json()["error"]["param"] == "Idempotency-Key"


def test_idempotency_keys_belong_to_their_tenant(
        client: TestClient, new_key: Callable[[], dict], model: str) -> None:
    a, b = new_key(), new_key()
    job_a = client.post("/v1/jobs", json=chat_job(model), headers={**a, "Idempotency-Key": "k"})
    job_b = client.post("/v1/jobs", json=chat_job(model), headers={**b, "Idempotency-Key": "k"})
    assert job_a.json()["id"] != job_b.json()["id"]


def test_cancel_stops_a_queued_job_and_refuses_its_result(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    job_id = client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["error"]["code"] == "cancelled"
    assert claim_jobs(session, [job_id], base_settings) == []
    assert write_results(session, [result(job_id)]) == []
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_cancelling_a_running_job_is_seen_by_the_worker(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    from store.worker import cancelled_job_ids

    ids = [client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
           for _ in range(2)]
    claim_jobs(session, ids, base_settings)
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth)
    assert cancelled_job_ids(session, ids) == {ids[0]}
    assert write_results(session, [result(i) for i in ids]) == [ids[1]]


def test_a_finished_job_cannot_be_cancelled(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    job_id = client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
    claim_jobs(session, [job_id], base_settings)
    mark_failed(session, [JobFailure(job_id, "prompt_too_long_for_model", "too long")])
    failed = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "prompt_too_long_for_model", "message": "too long"}
    response = client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "job_not_cancellable"


def test_a_job_delivered_too_often_is_failed(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    job_id = client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
    for _ in range(base_settings.max_job_attempts):
        assert len(claim_jobs(session, [job_id], base_settings)) == 1
    assert claim_jobs(session, [job_id], base_settings) == []
    job = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "failed" and job["error"]["code"] == "too_many_attempts"
