"""Alembic is the only way the schema changes: it goes down and up again, and it matches
the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool

from store.migrate import downgrade, upgrade
from store.models import Base
from tests.api.conftest import tables


def test_downgrade_to_base_then_upgrade_to_head(scratch_db: str) -> None:
    upgrade("head", scratch_db)
    assert {"tenants", "api_keys", "files", "file_chunks", "batches", "jobs"} <= tables(scratch_db)
    downgrade("base", scratch_db)
    assert tables(scratch_db) == {"alembic_version"}
    upgrade("head", scratch_db)
    assert "jobs" in tables(scratch_db)


def test_the_migrated_schema_matches_the_models(db_url: str) -> None:
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []
