"""Request and response bodies. Job requests reuse store.openai_batch.GenerationBody, so the
API, batch files and `quern run` accept the same sampling parameters."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, field_validator, model_validator
from pydantic_core import PydanticCustomError

from store.models import Batch, File, Job
from store.openai_batch import GenerationBody

MAX_METADATA_KEYS = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

T = TypeVar("T")


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_KEYS:
        raise ValueError(f"at most {MAX_METADATA_KEYS} metadata keys")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(f"metadata keys hold at most {MAX_METADATA_KEY_CHARS} characters "
                             f"and values {MAX_METADATA_VALUE_CHARS}")
    return metadata


class JobCreate(GenerationBody):
    model: str  # required here: it picks the queue
    priority: Literal["interactive", "batch"] = "interactive"
    webhook_url: AnyHttpUrl | None = None
    metadata: dict[str, str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_of_messages_or_prompt(cls, data: Any) -> Any:
        # checked before field validation so the error can name the field to add or drop
        if isinstance(data, dict):
            if "messages" not in data and "prompt" not in data:
                raise PydanticCustomError("missing_prompt", "give `messages` or `prompt`",
                                          {"param": "messages"})
            if "messages" in data and "prompt" in data:
                raise PydanticCustomError("conflicting_fields",
                                          "give `messages` or `prompt`, not both",
                                          {"param": "prompt"})
        return data

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(metadata)

    def generation(self) -> GenerationBody:
        fields = self.model_dump(exclude_unset=True,
                                 exclude={"priority", "webhook_url", "metadata"})
        return GenerationBody.model_validate(fields)


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(metadata)


def epoch(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class JobObject(BaseModel):
    id: str
    object: Literal["job"] = "job"
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    model: str
    endpoint: str
    priority: str
    request: dict[str, Any]
    output: str | None
    finish_reason: str | None
    choices: list[dict[str, Any]] | None
    usage: Usage | None
    error: ErrorBody | None
    batch_id: str | None
    custom_id: str | None
    metadata: dict[str, str] | None
    webhook_url: str | None
    attempts: int
    created_at: int
    started_at: int | None
    finished_at: int | None

    @classmethod
    def from_row(cls, job: Job) -> JobObject:
        usage = None
        if job.prompt_tokens is not None:
            completion = job.completion_tokens or 0
            usage = Usage(prompt_tokens=job.prompt_tokens, completion_tokens=completion,
                          total_tokens=job.prompt_tokens + completion,
                          cached_tokens=job.cached_tokens or 0)
        return cls(id=job.id, status=job.status, model=job.model, endpoint=job.endpoint,
                   priority=job.priority, request=job.request, output=job.output_text,
                   finish_reason=job.finish_reason, choices=job.choices, usage=usage,
                   error=job.error, batch_id=job.batch_id, custom_id=job.custom_id,
                   metadata=job.metadata_, webhook_url=job.webhook_url, attempts=job.attempts,
                   created_at=epoch(job.created_at), started_at=epoch(job.started_at),
                   finished_at=epoch(job.finished_at))


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str
    expires_at: int | None = None
    status_details: str | None = None

    @classmethod
    def from_row(cls, file: File) -> FileObject:
        return cls(id=file.id, bytes=file.bytes or 0, created_at=epoch(file.created_at),
                   filename=file.filename, purpose=file.purpose, status=file.status)


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None

    @classmethod
    def from_row(cls, batch: Batch) -> BatchObject:
        times = {name: epoch(getattr(batch, name)) for name in (
            "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
            "expired_at", "cancelling_at", "cancelled_at")}
        return cls(id=batch.id, endpoint=batch.endpoint, model=batch.model, errors=batch.errors,
                   input_file_id=batch.input_file_id,
                   completion_window=batch.completion_window, status=batch.status,
                   output_file_id=batch.output_file_id, error_file_id=batch.error_file_id,
                   created_at=epoch(batch.created_at),
                   request_counts=RequestCounts(total=batch.total, completed=batch.completed,
                                                failed=batch.failed),
                   metadata=batch.metadata_, **times)


class HasId(Protocol):
    id: str


class ListObject(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, items: list[Any], has_more: bool) -> ListObject[T]:
        ids: list[HasId] = items
        return cls(data=items, first_id=ids[0].id if ids else None,
                   last_id=ids[-1].id if ids else None, has_more=has_more)
