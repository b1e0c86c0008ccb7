"""OpenAI-style batches: validation faults name their lines, accepted files become queued
jobs in chunk messages, and results come back as output and error files in input order."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import Job
from store.queue import RUN_JOBS_TASK, queue_name
from store.settings import Settings
from store.worker import JobFailure, JobResult, claim_jobs, mark_failed, write_results
from tests.api.conftest import queued_messages
from tests.api.test_files import upload


def line(custom_id: str, model: str, content: str = "hi", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}],
                     **body}}


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((x if isinstance(x, bytes) else orjson.dumps(x)) + b"\n" for x in lines)


def run_batch(client: TestClient, auth: dict, content: bytes,
              endpoint: str = "/v1/chat/completions") -> dict[str, Any]:
    file_id = upload(client, auth, content).json()["id"]
    response = client.post("/v1/batches", headers=auth, json={
        "input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h",
        "metadata": {"project": "t"}})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "validating"
    # TestClient runs the validation (a background task) before returning
    return client.get(f"/v1/batches/{response.json()['id']}", headers=auth).json()


def test_an_accepted_batch_becomes_queued_jobs_in_chunk_messages(
        client: TestClient, auth: dict, model: str, session: Session,
        redis_client: redis.Redis) -> None:
    batch = run_batch(client, auth, jsonl([line(f"req-{i}", model) for i in range(10)]))
    assert batch["status"] == "in_progress", batch["errors"]
    assert batch["request_counts"] == {"total": 10, "completed": 0, "failed": 0}
    assert batch["model"] == model and batch["metadata"] == {"project": "t"}
    assert batch["expires_at"] - batch["created_at"] == 24 * 3600

    jobs = session.scalars(select(Job).where(Job.batch_id == batch["id"])
                           .order_by(Job.line_no)).all()
    assert [(j.line_no, j.custom_id, j.priority, j.status) for j in jobs] == [
        (i + 1, f"req-{i}", "batch", "queued") for i in range(10)]
    messages = queued_messages(redis_client, queue_name(model, "batch"))
    assert {m["task"] for m in messages} == {RUN_JOBS_TASK}
    assert [len(m["kwargs"]["job_ids"]) for m in messages] == [4, 4, 2]  # jobs_per_message=4
    assert [i for m in messages for i in m["kwargs"]["job_ids"]] == [j.id for j in jobs]


def test_a_finished_batch_has_output_and_error_files_in_input_order(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    batch = run_batch(client, auth, jsonl([line(f"req-{i}", model) for i in range(6)]))
    ids = [j.id for j in session.scalars(select(Job).where(Job.batch_id == batch["id"])
                                         .order_by(Job.line_no))]
    claim_jobs(session, list(reversed(ids)), base_settings)
    # results arrive out of order, in two transactions; job 2 fails
    write_results(session, [JobResult(i, [{"text": f"out {i}", "finish_reason": "length",
                                           "num_tokens": 5}], prompt_tokens=4)
                            for i in (ids[5], ids[0], ids[3])])
    midway = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()
    assert midway["status"] == "in_progress"
    assert midway["request_counts"] == {"total": 6, "completed": 3, "failed": 0}
    mark_failed(session, [JobFailure(ids[2], "engine_error", "the engine stopped")])
    write_results(session, [JobResult(i, [{"text": f"out {i}", "finish_reason": "stop",
                                           "num_tokens": 1}], prompt_tokens=4, cached_tokens=2)
                            for i in (ids[1], ids[4])])

    done = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    assert done["completed_at"] and done["finalizing_at"] and done["in_progress_at"]

    output = client.get(f"/v1/files/{done['output_file_id']}/content", headers=auth).content
    lines = [json.loads(x) for x in output.splitlines()]
    assert [x["custom_id"] for x in lines] == ["req-0", "req-1", "req-3", "req-4", "req-5"]
    first = lines[0]["response"]
    assert first["status_code"] == 200 and first["request_id"] == ids[0]
    assert first["body"]["choices"][0]["message"] == {"role": "assistant",
                                                      "content": f"out {ids[0]}"}
    assert first["body"]["usage"]["completion_tokens"] == 5
    assert lines[1]["response"]["body"]["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    errors = client.get(f"/v1/files/{done['error_file_id']}/content", headers=auth).content
    assert [json.loads(x) for x in errors.splitlines()] == [{
        "id": "batch_req_" + ids[2].removeprefix("job_"), "custom_id": "req-2",
        "response": None, "error": {"code": "engine_error", "message": "the engine stopped"}}]
    # a generated file reads the same every time and knows its size
    assert client.get(f"/v1/files/{done['output_file_id']}/content", headers=auth).content \
        == output
    described = client.get(f"/v1/files/{done['output_file_id']}", headers=auth).json()
    assert described["bytes"] == len(output) and described["purpose"] == "batch_output"


def test_cancelling_a_batch_cancels_its_pending_jobs(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    batch = run_batch(client, auth, jsonl([line(f"r{i}", model) for i in range(3)]))
    ids = [j.id for j in session.scalars(select(Job).where(Job.batch_id == batch["id"])
                                         .order_by(Job.line_no))]
    claim_jobs(session, ids[:1], base_settings)
    write_results(session, [JobResult(ids[0], [{"text": "a", "finish_reason": "stop",
                                                "num_tokens": 1}], prompt_tokens=1)])
    cancelled = client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth).json()
    assert cancelled["status"] == "cancelled" and cancelled["cancelling_at"]
    assert cancelled["cancelled_at"] and cancelled["request_counts"]["completed"] == 1
    assert claim_jobs(session, ids, base_settings) == []
    errors = client.get(f"/v1/files/{cancelled['error_file_id']}/content", headers=auth)
    assert [json.loads(x)["error"]["code"] for x in errors.content.splitlines()] == [
        "batch_cancelled", "batch_cancelled"]
    again = client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_a_completed_batch_cannot_be_cancelled(
        client: TestClient, auth: dict, model: str, session: Session,
        base_settings: Settings) -> None:
    batch = run_batch(client, auth, jsonl([line("only", model)]))
    job_id = session.scalars(select(Job.id).where(Job.batch_id == batch["id"])).one()
    claim_jobs(session, [job_id], base_settings)
    write_results(session, [JobResult(job_id, [{"text": "a", "finish_reason": "stop",
                                                "num_tokens": 1}], prompt_tokens=1)])
    response = client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "batch_not_cancellable"


def bad_files(model: str) -> dict[str, tuple[bytes, list[tuple[str, int | None, str | None]]]]:
    good = [line(f"ok-{i}", model) for i in range(3)]
    return {
        "malformed line": (jsonl([*good, b'{"custom_id": "x", "method": "POST",', good[0]]),
                           [("invalid_json", 4, None), ("duplicate_custom_id", 5, "custom_id")]),
        "duplicate custom_id": (jsonl([*good, line("ok-1", model)]),
                                [("duplicate_custom_id", 4, "custom_id")]),
        "method other than POST": (jsonl([good[0], {**line("g", model), "method": "GET"}]),
                                   [("invalid_method", 2, "method")]),
        "unsupported url": (jsonl([{**line("e", model), "url": "/v1/embeddings"}, good[1]]),
                            [("invalid_url", 1, "url")]),
        "url differing from the endpoint": (
            jsonl([good[0], {**line("c", model), "url": "/v1/completions",
                             "body": {"model": model, "prompt": "x"}}]),
            [("mismatched_url", 2, "url")]),
        "more than one model": (jsonl([*good, line("m", model + "-b")]),
                                [("mismatched_model", 4, "body.model")]),
        "a model not served": (jsonl([line("u", "no-such-model")]),
                               [("model_not_found", 1, "body.model")]),
        "an invalid sampling param": (jsonl([good[0], line("t", model, temperature=9)]),
                                      [("invalid_request", 2, "body.temperature")]),
        "a prompt over the limit": (jsonl([line("p", model, content="x" * 3000)]),
                                    [("prompt_too_long", 1, "body.messages")]),
        "an empty file": (b"\n\n", [("empty_file", None, None)]),
    }


@pytest.mark.parametrize("fault", list(bad_files("m")))
def test_a_faulty_file_fails_the_batch_naming_each_line(
        fault: str, client: TestClient, auth: dict, model: str, session: Session) -> None:
    content, expected = bad_files(model)[fault]
    batch = run_batch(client, auth, content)
    assert batch["status"] == "failed" and batch["failed_at"]
    assert batch["errors"]["object"] == "list"
    assert [(e["code"], e["line"], e["param"]) for e in batch["errors"]["data"]] == expected
    assert all(e["message"] for e in batch["errors"]["data"])
    assert session.scalars(select(Job).where(Job.batch_id == batch["id"])).all() == []


def test_too_many_lines_fail_the_batch_at_the_first_line_over(
        make_client, auth: dict, model: str) -> None:
    small = make_client(batch_max_lines=5)
    batch = run_batch(small, auth, jsonl([line(f"r{i}", model) for i in range(8)]))
    assert batch["status"] == "failed"
    assert [(e["code"], e["line"]) for e in batch["errors"]["data"]] == [("too_many_lines", 6)]


def test_lines_split_across_storage_chunks_parse_whole(
        client: TestClient, auth: dict, model: str) -> None:
    lines = [line(f"long-{i}", model, content="z" * 1500) for i in range(12)]  # > 4 KiB chunks
    batch = run_batch(client, auth, jsonl(lines))
    assert batch["status"] == "in_progress", batch["errors"]
    assert batch["request_counts"]["total"] == 12


def test_a_batch_needs_a_batch_file_of_the_caller(
        client: TestClient, auth: dict, model: str) -> None:
    response = client.post("/v1/batches", headers=auth, json={
        "input_file_id": "file-nope", "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    assert response.status_code == 404
    assert response.json()["error"] == {"code": "file_not_found", "param": "input_file_id",
                                        "message": "no file 'file-nope'"}
