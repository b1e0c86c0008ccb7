"""jobs.enqueued_at, for the reconciler

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 16:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # existing rows get the migration's time: pending ones are reconsidered a grace period on
    op.add_column("jobs", sa.Column("enqueued_at", sa.DateTime(timezone=True),
                                    server_default=sa.text("now()"), nullable=False))
    op.create_index("ix_jobs_pending_enqueued", "jobs", ["enqueued_at"], unique=False,
                    postgresql_where=sa.text("status IN ('queued', 'running')"))


def downgrade() -> None:
    op.drop_index("ix_jobs_pending_enqueued", table_name="jobs",
                  postgresql_where=sa.text("status IN ('queued', 'running')"))
    op.drop_column("jobs", "enqueued_at")
