"""/v1/jobs: one generation request each."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Header, Query, Response
from sqlalchemy.orm import Session

from api.deps import Caller, caller, db_session, settings
from api.schemas import JobCreate, JobObject, ListObject
from store import jobs
from store.settings import Settings

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


@router.post("", status_code=202, response_model=JobObject)
def create_job(payload: JobCreate, response: Response,
               idempotency_key: str | None = Header(default=None, max_length=255),
               who: Caller = Depends(caller), session: Session = Depends(db_session),
               config: Settings = Depends(settings)) -> JobObject:
    job, created = jobs.submit_job(
        session, who.tenant_id, payload.generation(), priority=payload.priority,
        settings=config, webhook_url=str(payload.webhook_url) if payload.webhook_url else None,
        metadata=payload.metadata, idempotency_key=idempotency_key)
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return JobObject.from_row(job)


@router.get("", response_model=ListObject[JobObject])
def list_jobs(after: str | None = None, limit: int = Query(default=20, ge=1, le=100),
              status: JobStatus | None = None, batch_id: str | None = None,
              who: Caller = Depends(caller),
              session: Session = Depends(db_session)) -> ListObject[JobObject]:
    rows, has_more = jobs.list_jobs(session, who.tenant_id, after=after, limit=limit,
                                    status=status, batch_id=batch_id)
    return ListObject[JobObject].of([JobObject.from_row(j) for j in rows], has_more)


@router.get("/{job_id}", response_model=JobObject)
def get_job(job_id: str, who: Caller = Depends(caller),
            session: Session = Depends(db_session)) -> JobObject:
    return JobObject.from_row(jobs.get_job(session, who.tenant_id, job_id))


@router.post("/{job_id}/cancel", response_model=JobObject)
def cancel_job(job_id: str, who: Caller = Depends(caller),
               session: Session = Depends(db_session)) -> JobObject:
    return JobObject.from_row(jobs.cancel_job(session, who.tenant_id, job_id))
