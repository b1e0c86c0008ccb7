"""Batch states the HTTP tests do not reach: cancel while validating, expiry, the sweep
that takes up interrupted validations, and result writers racing for the last job."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from store.batches import create_batch, expire_batches, run_maintenance, validate_and_expand
from store.db import sessionmaker_for
from store.models import Batch, File, Job
from store.settings import Settings
from store.worker import JobResult, claim_jobs, write_results
from tests.api.conftest import chat_job
from tests.api.test_batches import jsonl, line, run_batch
from tests.api.test_files import upload


def caller_tenant(client: TestClient, auth: dict, model: str, session: Session) -> str:
    job_id = client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
    return session.get_one(Job, job_id).tenant_id


def test_a_batch_cancelled_while_validating_gets_no_jobs(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    tenant_id = caller_tenant(client, auth, model, session)
    file_id = upload(client, auth, jsonl([line("a", model)])).json()["id"]
    batch = create_batch(session, tenant_id, input_file_id=file_id,
                         endpoint="/v1/chat/completions", completion_window="24h", metadata=None)
    cancelling = client.post(f"/v1/batches/{batch.id}/cancel", headers=auth).json()
    assert cancelling["status"] == "cancelling"
    assert validate_and_expand(batch.id, base_settings) == "cancelled"
    done = client.get(f"/v1/batches/{batch.id}", headers=auth).json()
    assert done["status"] == "cancelled" and done["cancelled_at"]
    assert session.scalars(select(Job).where(Job.batch_id == batch.id)).all() == []


def test_the_maintenance_sweep_takes_up_an_interrupted_validation_once(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    tenant_id = caller_tenant(client, auth, model, session)
    file_id = upload(client, auth, jsonl([line(f"r{i}", model) for i in range(3)])).json()["id"]
    batch = create_batch(session, tenant_id, input_file_id=file_id,
                         endpoint="/v1/chat/completions", completion_window="24h", metadata=None)
    run_maintenance(base_settings)  # as if the process that took the POST had died
    assert client.get(f"/v1/batches/{batch.id}", headers=auth).json()["status"] == "in_progress"
    assert validate_and_expand(batch.id, base_settings) is None  # nothing to do twice
    assert len(session.scalars(select(Job).where(Job.batch_id == batch.id)).all()) == 3


def test_an_expired_batch_keeps_its_results_and_cancels_the_rest(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    batch = run_batch(client, auth, jsonl([line(f"r{i}", model) for i in range(3)]))
    ids = list(session.scalars(select(Job.id).where(Job.batch_id == batch["id"])
                               .order_by(Job.line_no)))
    claim_jobs(session, ids[:1], base_settings)
    write_results(session, [JobResult(ids[0], [{"text": "a", "finish_reason": "stop",
                                                "num_tokens": 1}], prompt_tokens=1)])
    session.execute(update(Batch).where(Batch.id == batch["id"]).values(
        expires_at=datetime.now(timezone.utc) - timedelta(seconds=1)))
    session.commit()
    assert batch["id"] in expire_batches(session)
    expired = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()
    assert expired["status"] == "expired" and expired["expired_at"]
    assert expired["output_file_id"] and expired["error_file_id"]
    errors = client.get(f"/v1/files/{expired['error_file_id']}/content", headers=auth).text
    assert errors.count('"batch_expired"') == 2


def test_concurrent_result_writers_complete_the_batch_exactly_once(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    batch = run_batch(client, auth, jsonl([line(f"r{i}", model) for i in range(24)]))
    ids = list(session.scalars(select(Job.id).where(Job.batch_id == batch["id"])))
    claim_jobs(session, ids, base_settings)
    make_session = sessionmaker_for(base_settings.database_url)
    barrier = threading.Barrier(8)

    def writer(part: list[str]) -> None:
        barrier.wait()
        with make_session() as own:
            for job_id in part:  # one transaction per result, to interleave as much as we can
                write_results(own, [JobResult(job_id, [{"text": "x", "finish_reason": "stop",
                                                        "num_tokens": 1}], prompt_tokens=1)])
            # a redelivered duplicate of the whole part, racing the others
            assert write_results(own, [JobResult(i, [], prompt_tokens=0) for i in part]) == []

    threads = [threading.Thread(target=writer, args=(ids[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 24, "completed": 24, "failed": 0}
    outputs = session.scalars(select(File.id).where(File.batch_id == batch["id"])).all()
    assert outputs == [done["output_file_id"]]  # finalized once: one generated file


def test_a_job_that_cannot_be_queued_answers_503_and_stays_saved(
        make_client, auth: dict, model: str, session: Session) -> None:
    no_broker = make_client(redis_url="redis://127.0.0.1:1/0")
    response = no_broker.post("/v1/jobs", json=chat_job(model), headers=auth)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "queue_unavailable"
    job_id = response.json()["error"]["message"].split()[1]
    assert session.get_one(Job, job_id).status == "queued"  # for the reconciler to re-send
