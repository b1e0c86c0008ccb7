"""Engines and sessions. One engine per database URL per process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import psycopg
from sqlalchemy import Engine, Select, create_engine
from sqlalchemy.orm import Session, sessionmaker

from store.settings import Settings, get_settings


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    # pre_ping: a worker holds connections for days; Postgres restarts must not fail a task
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@lru_cache(maxsize=8)
def sessionmaker_for(url: str) -> sessionmaker[Session]:
    # expire_on_commit=False: routes return the committed rows as JSON after commit
    return sessionmaker(engine_for(url), expire_on_commit=False)


@contextmanager
def session_scope(settings: Settings | None = None) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on error."""
    session = sessionmaker_for((settings or get_settings()).database_url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def raw_connection(session: Session) -> psycopg.Connection:
    """The psycopg connection under a session, for COPY."""
    return session.connection().connection.driver_connection


def for_update(query: Select[Any]) -> Select[Any]:
    """SELECT ... FOR UPDATE that also refreshes rows the session already holds: the fresh
    values are the point of taking the lock."""
    return query.with_for_update().execution_options(populate_existing=True)
