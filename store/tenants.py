"""Tenants and their API keys. A key is shown once, at creation; only its sha256 is kept,
which is enough for a 256-bit random key (no salt or slow hash needed: nothing to brute
force)."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import ApiKey, Tenant

KEY_PREFIX = "qk-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(session: Session, tenant_name: str) -> tuple[Tenant, str]:
    """Create a key for ``tenant_name`` (creating the tenant if new); return it in clear."""
    tenant = session.scalars(select(Tenant).where(Tenant.name == tenant_name)).one_or_none()
    if tenant is None:
        tenant = Tenant(name=tenant_name)
        session.add(tenant)
        session.flush()
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(tenant_id=tenant.id, key_hash=hash_key(key), prefix=key[:10]))
    session.flush()
    return tenant, key


def tenant_for_key(session: Session, key: str) -> Tenant | None:
    return session.scalars(
        select(Tenant).join(ApiKey, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
    ).one_or_none()
