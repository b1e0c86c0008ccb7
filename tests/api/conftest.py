"""Fixtures for the API tests: a fresh Postgres database per test run (made here, migrated by
Alembic, dropped at the end), real Redis with queue names unique to the run, and apps
built from explicit settings."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect, pool
from sqlalchemy.orm import Session

from api.app import create_app
from store.db import engine_for, sessionmaker_for
from store.migrate import upgrade
from store.queue import queue_name
from store.settings import Settings
from store.tenants import create_api_key

SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"


def database_url(name: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def create_database(name: str) -> None:
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    engine_for(database_url(name)).dispose()  # close this process's pooled connections
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def db_url() -> Iterator[str]:
    name = f"quern_test_{uuid.uuid4().hex[:12]}"
    create_database(name)
    try:
        upgrade("head", database_url(name))
        yield database_url(name)
    finally:
        drop_database(name)


@pytest.fixture
def scratch_db() -> Iterator[str]:
    """An empty database of its own, for tests that migrate up and down."""
    name = f"quern_test_mig_{uuid.uuid4().hex[:10]}"
    create_database(name)
    try:
        yield database_url(name)
    finally:
        drop_database(name)


def tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def model() -> str:
    return f"test-model-{uuid.uuid4().hex[:8]}"  # so queue names are this run's alone


@pytest.fixture(scope="session")
def redis_client(model: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    for key in client.scan_iter(match=f"*{model}*"):
        client.delete(key)
    client.close()


@pytest.fixture(scope="session")
def base_settings(db_url: str, model: str) -> Settings:
    return Settings(database_url=db_url, redis_url=REDIS_URL, models=[model, model + "-b"],
                    max_body_bytes=64_000, max_file_bytes=5_000_000, max_prompt_chars=2_000,
                    max_tokens_cap=512, max_queued_jobs_per_tenant=200, batch_max_lines=50_000,
                    file_chunk_bytes=4096, jobs_per_message=4, maintenance_interval_s=0)


@pytest.fixture(scope="session")
def make_client(base_settings: Settings) -> Callable[..., TestClient]:
    """A TestClient for an app whose settings differ from the base ones by ``overrides``."""
    def make(**overrides: Any) -> TestClient:
        return TestClient(create_app(base_settings.model_copy(update=overrides)))
    return make


@pytest.fixture(scope="session")
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


@pytest.fixture
def session(base_settings: Settings) -> Iterator[Session]:
    with sessionmaker_for(base_settings.database_url)() as s:
        yield s


@pytest.fixture
def new_key(base_settings: Settings) -> Callable[[], dict[str, str]]:
    """Make a fresh tenant and return its auth headers."""
    def make() -> dict[str, str]:
        with sessionmaker_for(base_settings.database_url)() as s:
            _, key = create_api_key(s, f"tenant-{uuid.uuid4().hex[:10]}")
            s.commit()
        return {"Authorization": f"Bearer {key}"}
    return make


@pytest.fixture
def auth(new_key: Callable[[], dict[str, str]]) -> dict[str, str]:
    return new_key()


@pytest.fixture(autouse=True)
def empty_queues(redis_client: redis.Redis, model: str) -> None:
    for m in (model, model + "-b"):
        for priority in ("interactive", "batch"):
            redis_client.delete(queue_name(m, priority))


def queued_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The Celery messages waiting in ``queue``, oldest first, as
    {"task", "args", "kwargs"}. Kombu LPUSHes and workers BRPOP, so reverse."""
    messages = []
    for raw in reversed(client.lrange(queue, 0, -1)):
        envelope = json.loads(raw)
        args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        messages.append({"task": envelope["headers"]["task"], "args": args, "kwargs": kwargs})
    return messages


def chat_job(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Say hi"}], **extra}
