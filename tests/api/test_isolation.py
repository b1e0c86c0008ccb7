"""Every read and write is scoped to the key's tenant: another tenant's ids answer 404 and
its objects never appear in lists."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from tests.api.conftest import chat_job
from tests.api.test_batches import jsonl, line, run_batch
from tests.api.test_files import upload


def test_another_tenants_objects_are_not_found_on_any_route(
        client: TestClient, new_key: Callable[[], dict], model: str) -> None:
    owner, other = new_key(), new_key()
    job_id = client.post("/v1/jobs", json=chat_job(model), headers=owner).json()["id"]
    batch = run_batch(client, owner, jsonl([line("a", model)]))
    file_id = batch["input_file_id"]

    not_found = {
        ("GET", f"/v1/jobs/{job_id}"): "job_not_found",
        ("POST", f"/v1/jobs/{job_id}/cancel"): "job_not_found",
        ("GET", f"/v1/jobs?after={job_id}"): "invalid_cursor",
        ("GET", f"/v1/files/{file_id}"): "file_not_found",
        ("GET", f"/v1/files/{file_id}/content"): "file_not_found",
        ("DELETE", f"/v1/files/{file_id}"): "file_not_found",
        ("GET", f"/v1/batches/{batch['id']}"): "batch_not_found",
        ("POST", f"/v1/batches/{batch['id']}/cancel"): "batch_not_found",
        ("GET", f"/v1/batches?after={batch['id']}"): "invalid_cursor",
    }
    for (method, path), code in not_found.items():
        response = client.request(method, path, headers=other)
        assert response.status_code in (400, 404), (method, path)
        assert response.json()["error"]["code"] == code, (method, path)
    stolen = client.post("/v1/batches", headers=other, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert stolen.status_code == 404 and stolen.json()["error"]["code"] == "file_not_found"

    assert client.get("/v1/jobs", headers=other).json()["data"] == []
    assert client.get(f"/v1/jobs?batch_id={batch['id']}", headers=other).json()["data"] == []
    assert client.get("/v1/batches", headers=other).json()["data"] == []

    # and the owner still has everything, untouched
    assert client.get(f"/v1/jobs/{job_id}", headers=owner).json()["status"] == "queued"
    assert client.get(f"/v1/files/{file_id}", headers=owner).status_code == 200
    assert client.get(f"/v1/batches/{batch['id']}", headers=owner).json()["status"] \
        == "in_progress"
    assert upload(client, other, b"{}\n").status_code == 200  # the other tenant can work


def test_routes_need_a_valid_key(client: TestClient) -> None:
    missing = client.get("/v1/jobs")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    for header in ("Bearer qk-not-a-key", "Basic dXNlcjpwYXNz", "qk-no-scheme"):
        wrong = client.get("/v1/batches", headers={"Authorization": header})
        assert wrong.status_code == 401
        assert wrong.json()["error"] == {"code": "invalid_api_key", "param": "Authorization",
                                         "message": "the API key is not valid"}


def test_health_probes_need_no_key(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"postgres": "ok", "redis": "ok"}}


def test_readyz_reports_an_unreachable_redis(make_client) -> None:
    broken = make_client(redis_url="redis://127.0.0.1:1/0")
    ready = broken.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"] == {"postgres": "ok", "redis": "unreachable"}
