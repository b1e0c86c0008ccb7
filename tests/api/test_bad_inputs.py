"""Bad requests are refused with a stable code and the field at fault."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import Job
from store.worker import JobResult, claim_jobs, write_results
from tests.api.conftest import chat_job
from tests.api.test_batches import jsonl, line, run_batch

M = "<model>"  # replaced by the run's model name


DROP = object()


def job(**changes: Any) -> dict[str, Any]:
    """A valid job body with ``changes`` applied; DROP removes a field."""
    body = {**chat_job(M), **changes}
    return {k: v for k, v in body.items() if v is not DROP}

# (case, method, path, json body or raw bytes, status, code, param)
CASES = [
    ("invalid JSON", "POST", "/v1/jobs", b'{"model": ', 400, "invalid_json", None),
    ("no model", "POST", "/v1/jobs", job(model=DROP), 400, "missing_field", "model"),
    ("unknown model", "POST", "/v1/jobs", job(model="gpt-17"), 400, "model_not_found", "model"),
    ("neither messages nor prompt", "POST", "/v1/jobs", job(messages=DROP), 400,
     "missing_prompt", "messages"),
    ("both messages and prompt", "POST", "/v1/jobs", job(prompt="x"), 400,
     "conflicting_fields", "prompt"),
    ("temperature out of range", "POST", "/v1/jobs", job(temperature=3), 400, "out_of_range",
     "temperature"),
    ("misspelt field", "POST", "/v1/jobs", job(temprature=0.2), 400, "unknown_field",
     "temprature"),
    ("max_tokens not a number", "POST", "/v1/jobs", job(max_tokens="ten"), 400, "invalid_type",
     "max_tokens"),
    ("max_tokens over the cap", "POST", "/v1/jobs", job(max_tokens=100_000), 400,
     "max_tokens_too_large", "max_tokens"),
    ("prompt over the limit", "POST", "/v1/jobs",
     job(messages=[{"role": "user", "content": "x" * 5000}]), 400, "prompt_too_long",
     "messages"),
    ("unknown role", "POST", "/v1/jobs", job(messages=[{"role": "robot", "content": "x"}]), 400,
     "invalid_value", "messages.0.role"),
    ("unknown priority", "POST", "/v1/jobs", job(priority="urgent"), 400, "invalid_value",
     "priority"),
    ("streaming asked for", "POST", "/v1/jobs", job(stream=True), 400, "invalid_value",
     "stream"),
    ("too many stop sequences", "POST", "/v1/jobs", job(stop=["a", "b", "c", "d", "e"]), 400,
     "invalid_value", "stop"),
    ("webhook that is not http", "POST", "/v1/jobs", job(webhook_url="ftp://example.com/x"),
     400, "invalid_value", "webhook_url"),
    ("too much metadata", "POST", "/v1/jobs", job(metadata={str(i): "v" for i in range(17)}),
     400, "invalid_value", "metadata"),
    ("body over the limit", "POST", "/v1/jobs", job(user="u" * 70_000), 413, "body_too_large",
     None),
    ("list limit zero", "GET", "/v1/jobs?limit=0", None, 400, "out_of_range", "limit"),
    ("unknown status filter", "GET", "/v1/jobs?status=done", None, 400, "invalid_value",
     "status"),
    ("unknown cursor", "GET", "/v1/jobs?after=job_missing", None, 400, "invalid_cursor",
     "after"),
    ("unknown job", "GET", "/v1/jobs/job_missing", None, 404, "job_not_found", "job_id"),
    ("unsupported batch endpoint", "POST", "/v1/batches",
     {"input_file_id": "f", "endpoint": "/v1/embeddings", "completion_window": "24h"}, 400,
     "invalid_value", "endpoint"),
    ("unsupported completion window", "POST", "/v1/batches",
     {"input_file_id": "f", "endpoint": "/v1/completions", "completion_window": "48h"}, 400,
     "invalid_value", "completion_window"),
    ("batch without input file", "POST", "/v1/batches",
     {"endpoint": "/v1/completions", "completion_window": "24h"}, 400, "missing_field",
     "input_file_id"),
    ("unknown batch", "GET", "/v1/batches/batch_missing", None, 404, "batch_not_found",
     "batch_id"),
    ("unknown file", "GET", "/v1/files/file-missing", None, 404, "file_not_found", "file_id"),
    ("unknown route", "GET", "/v1/nothing", None, 404, "not_found", None),
]


def _replace_model(value: Any, model: str) -> Any:
    if isinstance(value, dict):
        return {k: _replace_model(v, model) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_model(v, model) for v in value]
    return model if value == M else value


@pytest.mark.parametrize(("case", "method", "path", "body", "status", "code", "param"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_bad_request_gets_its_code_and_param(
        case: str, method: str, path: str, body: Any, status: int, code: str,
        param: str | None, client: TestClient, auth: dict, model: str) -> None:
    if isinstance(body, bytes):
        response = client.request(method, path, content=body,
                                  headers={**auth, "Content-Type": "application/json"})
    else:
        response = client.request(method, path, json=_replace_model(body, model), headers=auth)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert error["message"]


def test_an_upload_needs_the_batch_purpose(client: TestClient, auth: dict) -> None:
    response = client.post("/v1/files", headers=auth, data={"purpose": "fine-tune"},
                           files={"file": ("a.jsonl", b"{}\n")})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_purpose"
    assert response.json()["error"]["param"] == "purpose"


def test_an_upload_needs_a_file(client: TestClient, auth: dict) -> None:
    response = client.post("/v1/files", headers=auth, data={"purpose": "batch"},
                           files={"other": ("a.txt", b"{}")})
    assert response.status_code == 400
    assert response.json()["error"] == {"code": "unexpected_file", "param": "other",
                                        "message": "send exactly one file, as `file`"}


def test_an_upload_must_be_multipart(client: TestClient, auth: dict) -> None:
    response = client.post("/v1/files", headers=auth, json={"purpose": "batch"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_content_type"


def test_a_batch_input_must_be_an_uploaded_batch_file(
        client: TestClient, auth: dict, model: str, session: Session) -> None:
    batch = run_batch(client, auth, jsonl([line("a", model)]))
    job_id = session.scalars(select(Job.id).where(Job.batch_id == batch["id"])).one()
    claim_jobs(session, [job_id], client.app.state.settings)
    write_results(session, [JobResult(job_id, [{"text": "a", "finish_reason": "stop",
                                                "num_tokens": 1}], prompt_tokens=1)])
    output_id = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()["output_file_id"]
    response = client.post("/v1/batches", headers=auth, json={
        "input_file_id": output_id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_input_file"
