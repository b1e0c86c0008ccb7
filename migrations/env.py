"""Alembic environment: the URL is, in order, `-x url=...`, the config's sqlalchemy.url
(store/migrate.py sets it), then QUERN_DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from store.models import Base
from store.settings import Settings

config = context.config


def database_url() -> str:
    return (context.get_x_argument(as_dictionary=True).get("url")
            or config.get_main_option("sqlalchemy.url")
            or Settings().database_url)


def run_offline() -> None:
    context.configure(url=database_url(), target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    engine = create_engine(database_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
