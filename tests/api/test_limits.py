"""Per-tenant caps on queued work."""

from __future__ import annotations

from collections.abc import Callable

from tests.api.conftest import chat_job
from tests.api.test_batches import jsonl, line, run_batch


def test_a_full_queue_answers_429_with_retry_after(
        make_client, new_key: Callable[[], dict], model: str) -> None:
    capped = make_client(max_queued_jobs_per_tenant=3, queue_full_retry_after_s=7)
    busy, idle = new_key(), new_key()
    for _ in range(3):
        assert capped.post("/v1/jobs", json=chat_job(model), headers=busy).status_code == 202
    refused = capped.post("/v1/jobs", json=chat_job(model), headers=busy)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "7"
    assert refused.json()["error"]["code"] == "queue_full"
    assert capped.post("/v1/jobs", json=chat_job(model), headers=idle).status_code == 202

    first = capped.get("/v1/jobs?limit=1", headers=busy).json()["data"][0]["id"]
    capped.post(f"/v1/jobs/{first}/cancel", headers=busy)  # room for one more
    assert capped.post("/v1/jobs", json=chat_job(model), headers=busy).status_code == 202


def test_a_batch_over_the_queued_batch_cap_fails(make_client, auth: dict, model: str) -> None:
    capped = make_client(max_queued_batch_jobs_per_tenant=4)
    assert run_batch(capped, auth, jsonl([line(f"a{i}", model) for i in range(3)]))["status"] \
        == "in_progress"
    over = run_batch(capped, auth, jsonl([line(f"b{i}", model) for i in range(2)]))
    assert over["status"] == "failed"
    assert over["errors"]["data"][0]["code"] == "queue_limit_exceeded"
