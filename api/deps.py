"""Request-scoped dependencies: settings, a database session, the caller's tenant."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api.errors import ApiError
from store.db import sessionmaker_for
from store.settings import Settings
from store.tenants import tenant_for_key


@dataclass(frozen=True)
class Caller:
    tenant_id: str
    tenant_name: str


def settings(request: Request) -> Settings:
    return request.app.state.settings


def db_session(request: Request) -> Iterator[Session]:
    session = sessionmaker_for(settings(request).database_url)()
    try:
        yield session
    finally:
        session.close()  # rolls back whatever a failed request left uncommitted


def caller(request: Request, session: Session = Depends(db_session)) -> Caller:
    header = request.headers.get("authorization")
    if not header:
        raise ApiError(401, "missing_api_key",
                       "send your API key as `Authorization: Bearer <key>`", "Authorization",
                       {"WWW-Authenticate": "Bearer"})
    scheme, _, key = header.partition(" ")
    tenant = tenant_for_key(session, key.strip()) if scheme.lower() == "bearer" else None
    if tenant is None:
        raise ApiError(401, "invalid_api_key", "the API key is not valid", "Authorization",
                       {"WWW-Authenticate": "Bearer"})
    session.rollback()  # end the read transaction; the route starts its own
    return Caller(tenant_id=tenant.id, tenant_name=tenant.name)
