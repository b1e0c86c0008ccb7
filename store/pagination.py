"""Cursor pagination, OpenAI style: newest first, ``after`` is the last id of the previous
page. The cursor resolves to the row's ``seq``, so pages never skip or repeat rows even when
many share a ``created_at``."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from store.errors import InvalidRequest


def page(session: Session, query: Select[Any], model: Any, tenant_id: str, after: str | None,
         limit: int) -> tuple[list[Any], bool]:
    """Run ``query`` (already filtered) newest first from cursor ``after``; return
    (rows, has_more)."""
    if after is not None:
        after_seq = session.scalar(
            select(model.seq).where(model.id == after, model.tenant_id == tenant_id))
        if after_seq is None:
            raise InvalidRequest("invalid_cursor", f"no object {after!r} to page after", "after")
        query = query.where(model.seq < after_seq)
    rows = list(session.scalars(query.order_by(model.seq.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit
