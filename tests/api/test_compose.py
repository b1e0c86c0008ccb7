"""compose.yaml runs what a user needs, wired to one Postgres and one Redis."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose.yaml"


def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_compose_has_the_services_and_their_commands() -> None:
    found = services()
    assert set(found) == {"postgres", "redis", "migrate", "api", "worker"}
    assert found["migrate"]["command"] == ["quern", "db", "upgrade"]
    assert found["api"]["command"][:2] == ["quern", "api"]
    assert "8000:8000" in found["api"]["ports"]
    assert found["worker"]["command"] == ["quern", "worker"]


def test_quern_services_share_the_database_and_broker() -> None:
    found = services()
    for name in ("migrate", "api", "worker"):
        env = found[name]["environment"]
        assert env["QUERN_DATABASE_URL"].startswith("postgresql+psycopg://quern:")
        assert "@postgres:5432/quern" in env["QUERN_DATABASE_URL"]
        assert env["QUERN_REDIS_URL"] == "redis://redis:6379/0"
    assert found["postgres"]["environment"]["POSTGRES_DB"] == "quern"


def test_the_worker_reserves_a_gpu_and_waits_for_the_schema() -> None:
    found = services()
    devices = found["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    for name in ("api", "worker"):
        assert found[name]["depends_on"]["migrate"]["condition"] \
            == "service_completed_successfully"
    assert found["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
