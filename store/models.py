"""The schema, as SQLAlchemy 2 models. Alembic migrations (migrations/) are what create it;
a test checks that the two agree.

Public ids carry a prefix (``job_``, ``file-``, ``batch_``) like OpenAI's, so a pasted id
says what it is. ``seq`` columns give a stable order for cursor pagination: rows made in one
transaction share ``created_at``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
PENDING_JOB_STATUSES = ("queued", "running")
BATCH_STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired",
                  "cancelling", "cancelled")


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB}


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True,
                                    default=lambda: new_id("tenant_"))
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=func.now())


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key_"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                           index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the key
    prefix: Mapped[str] = mapped_column(String(16))  # shown to people telling keys apart
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class File(Base):
    """An uploaded file (content in ``file_chunks``) or a batch's output or error file,
    which is generated from job rows when read (``batch_id`` set, no chunks)."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("file-"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))  # batch | batch_output
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int | None] = mapped_column(BigInteger)  # generated files: known once read
    status: Mapped[str] = mapped_column(String(16), server_default="processed")
    batch_id: Mapped[str | None] = mapped_column(String(40))
    # upload | output | error
    kind: Mapped[str] = mapped_column(String(16), server_default="upload")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=func.now())

    __table_args__ = (Index("ix_files_tenant_id", "tenant_id"),)


class FileChunk(Base):
    __tablename__ = "file_chunks"

    file_id: Mapped[str] = mapped_column(ForeignKey("files.id", ondelete="CASCADE"),
                                         primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True,
                                    default=lambda: new_id("batch_"))
    seq: Mapped[int] = mapped_column(BigInteger, Identity(), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(8))
    status: Mapped[str] = mapped_column(String(16), server_default="validating")
    model: Mapped[str | None] = mapped_column(String(200))
    errors: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    total: Mapped[int] = mapped_column(Integer, server_default="0")
    completed: Mapped[int] = mapped_column(Integer, server_default="0")
    failed: Mapped[int] = mapped_column(Integer, server_default="0")
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=func.now())
    in_progress_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finalizing_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancelling_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancelled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("ix_batches_tenant_seq", "tenant_id", "seq"),
        # the maintenance sweep looks for these
        Index("ix_batches_open", "status",
              postgresql_where=text("status IN ('validating', 'in_progress', 'cancelling')")),
    )


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("job_"))
    seq: Mapped[int] = mapped_column(BigInteger, Identity(), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    line_no: Mapped[int | None] = mapped_column(Integer)
    custom_id: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(64))  # /v1/chat/completions | /v1/completions
    request: Mapped[dict[str, Any]] = mapped_column(JSONB)  # a GenerationBody, as given
    priority: Mapped[str] = mapped_column(String(16))  # interactive | batch
    status: Mapped[str] = mapped_column(String(16), server_default="queued")
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    webhook_url: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB)
    # per output choice: text, finish_reason, num_tokens, logprobs (store/openai_batch's shape)
    choices: Mapped[list[Any] | None] = mapped_column(JSONB)
    output_text: Mapped[str | None] = mapped_column(Text)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # when a message for the job was last sent (or last seen waiting in Redis): the
    # reconciler re-sends pending jobs whose message has been gone longer than a grace period
    enqueued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                  server_default=func.now())

    __table_args__ = (
        Index("ix_jobs_tenant_seq", "tenant_id", "seq"),
        Index("ix_jobs_tenant_status_seq", "tenant_id", "status", "seq"),
        Index("ix_jobs_batch_line", "batch_id", "line_no"),
        Index("ix_jobs_tenant_idempotency", "tenant_id", "idempotency_key", unique=True,
              postgresql_where=text("idempotency_key IS NOT NULL")),
        # "is anything of this batch still pending?" after every result write
        Index("ix_jobs_batch_pending", "batch_id",
              postgresql_where=text("status IN ('queued', 'running')")),
        # the reconciler's "pending, and not sent for a while"
        Index("ix_jobs_pending_enqueued", "enqueued_at",
              postgresql_where=text("status IN ('queued', 'running')")),
    )
