"""`quern keys create` and `quern db` drive the same store functions the tests use."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from quern.cli import app
from store.settings import get_settings
from tests.api.conftest import tables


@pytest.fixture
def env_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    def use(url: str) -> None:
        monkeypatch.setenv("QUERN_DATABASE_URL", url)
        get_settings.cache_clear()
    yield use
    get_settings.cache_clear()


def test_keys_create_prints_a_key_that_authenticates(
        env_database, db_url: str, client: TestClient) -> None:
    env_database(db_url)
    name = f"cli-{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(app, ["keys", "create", "--tenant", name])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip().splitlines()[-1]
    assert key.startswith("qk-") and len(key) > 40
    response = client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200 and response.json()["data"] == []


def test_db_commands_migrate_down_and_up(env_database, scratch_db: str) -> None:
    env_database(scratch_db)
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    assert "jobs" in tables(scratch_db)
    assert runner.invoke(app, ["db", "downgrade", "base"]).exit_code == 0
    assert tables(scratch_db) == {"alembic_version"}
