"""Lists page newest first with an `after` cursor, and filter by status and batch."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import chat_job
from tests.api.test_batches import jsonl, line, run_batch


def test_jobs_page_newest_first_without_gaps_or_repeats(
        client: TestClient, auth: dict, model: str) -> None:
    created = [client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
               for _ in range(12)]
    seen, after, pages = [], None, 0
    while True:
        query = "/v1/jobs?limit=5" + (f"&after={after}" if after else "")
        page = client.get(query, headers=auth).json()
        pages += 1
        assert page["object"] == "list"
        seen += [j["id"] for j in page["data"]]
        assert page["first_id"] == page["data"][0]["id"]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert pages == 3
    assert seen == list(reversed(created))


def test_jobs_filter_by_status_and_batch(client: TestClient, auth: dict, model: str) -> None:
    kept = client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
    dropped = client.post("/v1/jobs", json=chat_job(model), headers=auth).json()["id"]
    client.post(f"/v1/jobs/{dropped}/cancel", headers=auth)
    batch = run_batch(client, auth, jsonl([line(f"r{i}", model) for i in range(3)]))

    cancelled = client.get("/v1/jobs?status=cancelled", headers=auth).json()["data"]
    assert [j["id"] for j in cancelled] == [dropped]
    queued = client.get("/v1/jobs?status=queued&limit=100", headers=auth).json()["data"]
    assert kept in {j["id"] for j in queued} and len(queued) == 4
    in_batch = client.get(f"/v1/jobs?batch_id={batch['id']}&limit=2", headers=auth).json()
    assert [j["custom_id"] for j in in_batch["data"]] == ["r2", "r1"]
    assert in_batch["has_more"] is True
    rest = client.get(f"/v1/jobs?batch_id={batch['id']}&after={in_batch['last_id']}",
                      headers=auth).json()
    assert [j["custom_id"] for j in rest["data"]] == ["r0"] and rest["has_more"] is False


def test_batches_page_with_after_and_limit(client: TestClient, auth: dict, model: str) -> None:
    ids = [run_batch(client, auth, jsonl([line("a", model)]))["id"] for _ in range(3)]
    first = client.get("/v1/batches?limit=2", headers=auth).json()
    assert [b["id"] for b in first["data"]] == [ids[2], ids[1]] and first["has_more"]
    second = client.get(f"/v1/batches?limit=2&after={first['last_id']}", headers=auth).json()
    assert [b["id"] for b in second["data"]] == [ids[0]] and not second["has_more"]
