"""The official openai SDK drives the Files and Batches API of a real server (uvicorn on a
free local port, in a thread)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import openai
import pytest
import uvicorn
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.app import create_app
from store.models import Job
from store.settings import Settings
from store.worker import JobResult, claim_jobs, write_results
from tests.api.test_batches import jsonl, line


@pytest.fixture(scope="module")
def base_url(base_settings: Settings) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(base_settings), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def sdk(base_url: str, auth: dict) -> openai.OpenAI:
    key = auth["Authorization"].removeprefix("Bearer ")
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=20)


def wait_while(sdk: openai.OpenAI, batch_id: str, status: str) -> openai.types.Batch:
    deadline = time.monotonic() + 20
    while (batch := sdk.batches.retrieve(batch_id)).status == status:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return batch


def test_the_openai_sdk_runs_a_batch_end_to_end(
        sdk: openai.OpenAI, model: str, session: Session, base_settings: Settings,
        tmp_path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl([line(f"q{i}", model, content=f"question {i}") for i in range(5)]))
    with path.open("rb") as handle:
        uploaded = sdk.files.create(file=handle, purpose="batch")
    assert uploaded.bytes == path.stat().st_size and uploaded.purpose == "batch"

    created = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h", metadata={"owner": "sdk"})
    assert created.object == "batch" and created.status == "validating"
    batch = wait_while(sdk, created.id, "validating")
    assert batch.status == "in_progress"
    assert batch.request_counts.total == 5 and batch.metadata == {"owner": "sdk"}

    # the worker's part, through the store functions it calls
    ids = list(session.scalars(select(Job.id).where(Job.batch_id == batch.id)))
    claim_jobs(session, ids, base_settings)
    write_results(session, [JobResult(i, [{"text": f"answer to {i}", "finish_reason": "stop",
                                           "num_tokens": 3}], prompt_tokens=9) for i in ids])

    done = sdk.batches.retrieve(batch.id)
    assert done.status == "completed" and done.error_file_id is None
    assert done.request_counts.completed == 5 and done.request_counts.failed == 0
    content = sdk.files.content(done.output_file_id)
    lines = [json.loads(x) for x in content.text.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"q{i}" for i in range(5)]
    assert all(x["response"]["body"]["object"] == "chat.completion" for x in lines)
    assert sdk.files.retrieve(done.output_file_id).bytes == len(content.content)
    assert sdk.files.content(uploaded.id).content == path.read_bytes()


def test_the_openai_sdk_lists_and_cancels_batches(
        sdk: openai.OpenAI, model: str, tmp_path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl([line("a", model), line("b", model)]))
    file_id = sdk.files.create(file=path.open("rb"), purpose="batch").id
    ids = [sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                              completion_window="24h").id for _ in range(3)]
    for batch_id in ids:
        wait_while(sdk, batch_id, "validating")

    listed = [b.id for b in sdk.batches.list(limit=2)]  # auto-paging follows `after`
    assert listed == list(reversed(ids))
    first_page = sdk.batches.list(limit=2)
    assert first_page.has_more and len(first_page.data) == 2

    cancelled = sdk.batches.cancel(ids[0])
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.batches.retrieve("batch_nope")
    assert missing.value.body["code"] == "batch_not_found"
    deleted = sdk.files.delete(file_id)
    assert deleted.deleted is True
