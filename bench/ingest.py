"""Ingest benchmark: upload an OpenAI Batch file through the API, create the batch, and wait
until every line is a queued job with its Celery message in Redis. Prints the time of each
step and the API process's peak RSS (VmHWM), for a small and a large file, so memory can be
seen not to grow with the file.

Runs against a real server (`quern api` in a subprocess), real Postgres (a scratch database,
dropped afterwards) and real Redis (queues named for a throwaway model, deleted afterwards):

    python bench/ingest.py [--lines 5000 50000]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import orjson
import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store.db import session_scope  # noqa: E402
from store.migrate import upgrade  # noqa: E402
from store.queue import queue_name  # noqa: E402
from store.settings import Settings  # noqa: E402
from store.tenants import create_api_key  # noqa: E402

SERVER_URL = os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")


def write_batch_file(path: Path, lines: int, model: str) -> int:
    with path.open("wb") as out:
        for i in range(lines):
            out.write(orjson.dumps({
                "custom_id": f"request-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": model, "max_tokens": 128, "temperature": 0.7, "messages": [
                    {"role": "system", "content": "You are a concise assistant."},
                    {"role": "user", "content": f"Summarise item {i}: " + "lorem ipsum " * 12},
                ]}}) + b"\n")
    return path.stat().st_size


def peak_rss_mb(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_one(lines: int, database_url: str, key: str, model: str, workdir: Path) -> dict:
    port = free_port()
    env = {**os.environ, "QUERN_DATABASE_URL": database_url, "QUERN_REDIS_URL": REDIS_URL,
           "QUERN_MODELS": orjson.dumps([model]).decode()}
    server = subprocess.Popen([sys.executable, "-m", "quern", "api", "--port", str(port),
                               "--log-level", "warning"], cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=120) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the API did not start")
                time.sleep(0.1)
            idle_mb = peak_rss_mb(server.pid)

            path = workdir / f"batch-{lines}.jsonl"
            size = write_batch_file(path, lines, model)
            start = time.perf_counter()
            with path.open("rb") as handle:  # httpx streams an open file
                upload = http.post("/v1/files", data={"purpose": "batch"},
                                   files={"file": (path.name, handle, "application/jsonl")})
            upload.raise_for_status()
            uploaded = time.perf_counter()
            batch = http.post("/v1/batches", json={
                "input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions",
                "completion_window": "24h"}).json()
            while batch["status"] == "validating":
                time.sleep(0.1)
                batch = http.get(f"/v1/batches/{batch['id']}").json()
            if batch["status"] != "in_progress":
                raise RuntimeError(f"batch {batch['status']}: {batch['errors']}")
            queue = queue_name(model, "batch")
            broker = redis.Redis.from_url(REDIS_URL)
            expected = -(-lines // Settings().jobs_per_message)
            while broker.llen(queue) < expected:  # messages go out after the commit
                time.sleep(0.05)
            queued = time.perf_counter()
            messages = broker.llen(queue)
            broker.delete(queue)
            broker.close()
        return {"lines": lines, "mb": size / 2**20, "upload_s": uploaded - start,
                "total_s": queued - start, "messages": messages, "idle_rss_mb": idle_mb,
                "peak_rss_mb": peak_rss_mb(server.pid),
                "jobs": batch["request_counts"]["total"]}
    finally:
        server.terminate()
        server.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[5000, 50000])
    args = parser.parse_args()
    name = f"quern_bench_{uuid.uuid4().hex[:10]}"
    database_url = f"postgresql+psycopg://{SERVER_URL.split('://', 1)[1].rsplit('/', 1)[0]}/{name}"
    model = f"bench-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade("head", database_url)
        with session_scope(Settings(database_url=database_url)) as session:
            _, key = create_api_key(session, "bench")
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for lines in args.lines:  # a fresh server each, so each peak is its own
                rows.append(run_one(lines, database_url, key, model, Path(tmp)))
        print(f"{'lines':>7} {'file MB':>8} {'upload s':>9} {'queued s':>9} {'messages':>9} "
              f"{'idle RSS MB':>12} {'peak RSS MB':>12}")
        for r in rows:
            assert r["jobs"] == r["lines"]
            print(f"{r['lines']:>7} {r['mb']:>8.1f} {r['upload_s']:>9.2f} {r['total_s']:>9.2f} "
                  f"{r['messages']:>9} {r['idle_rss_mb']:>12.1f} {r['peak_rss_mb']:>12.1f}")
        print("queued s: from the start of the upload until every job row is committed and "
              "every Celery message is in Redis")
    finally:
        from store.db import engine_for

        engine_for(database_url).dispose()
        with psycopg.connect(SERVER_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        client = redis.Redis.from_url(REDIS_URL)
        for stale in client.scan_iter(match=f"*{model}*"):
            client.delete(stale)


if __name__ == "__main__":
    main()
