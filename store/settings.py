"""Settings shared by the API, the worker and the CLI, read from ``QUERN_*`` environment
variables. Defaults work on a laptop with local Redis and Postgres."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUERN_", extra="ignore")

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/quern"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Models this deployment serves; a job naming another model is refused up front rather
    # than waiting forever on a queue no worker drains.
    models: list[str] = Field(default_factory=lambda: ["smollm2"])

    max_body_bytes: int = 1 << 20  # JSON request bodies
    max_file_bytes: int = 200 << 20  # uploads; OpenAI's own batch-file limit
    max_prompt_chars: int = 200_000
    max_tokens_cap: int = 8192
    max_queued_jobs_per_tenant: int = 1000  # interactive jobs (POST /v1/jobs) waiting
    max_queued_batch_jobs_per_tenant: int = 1_000_000  # batch lines waiting, all batches
    queue_full_retry_after_s: int = 5
    batch_max_lines: int = 50_000
    batch_max_errors: int = 1000  # line errors reported per failed batch; the rest are counted
    file_chunk_bytes: int = 1 << 20
    max_job_attempts: int = 3  # deliveries before a job is failed (a request that kills workers)
    jobs_per_message: int = 64  # job ids per Celery message for bulk work
    maintenance_interval_s: float = 30.0  # API sweep: expire batches, resume validation,
    # reconcile. A queued job whose message is not in Redis this long after it was sent is
    # re-sent; a running one, this long past Celery's visibility timeout (its worker died).
    requeue_after_s: float = 300.0
    reclaim_margin_s: float = 600.0
    reconcile_batch_size: int = 1000  # jobs locked and re-sent per transaction


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
