"""Reachability checks for /readyz."""

from __future__ import annotations

import redis
from sqlalchemy import text

from store.db import engine_for
from store.settings import Settings


def database_reachable(settings: Settings) -> bool:
    try:
        with engine_for(settings.database_url).connect() as connection:
            connection.execute(text("SELECT 1"))
        return True
    except Exception:  # any failure means "not ready"; the reason is not the probe's concern
        return False


def redis_reachable(settings: Settings) -> bool:
    try:
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=2,
                                      socket_connect_timeout=2)
        with client:
            return bool(client.ping())
    except redis.RedisError:
        return False
