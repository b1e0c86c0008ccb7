"""/v1/batches: the OpenAI Batch API."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Depends, Query
from sqlalchemy.orm import Session

from api.deps import Caller, caller, db_session, settings
from api.schemas import BatchCreate, BatchObject, ListObject
from store import batches
from store.settings import Settings

router = APIRouter(prefix="/v1/batches", tags=["batches"])


@router.post("", response_model=BatchObject)
def create_batch(payload: BatchCreate, background: BackgroundTasks,
                 who: Caller = Depends(caller), session: Session = Depends(db_session),
                 config: Settings = Depends(settings)) -> BatchObject:
    batch = batches.create_batch(session, who.tenant_id, input_file_id=payload.input_file_id,
                                 endpoint=payload.endpoint,
                                 completion_window=payload.completion_window,
                                 metadata=payload.metadata)
    # validation streams the whole file: answer "validating" now, as OpenAI does
    background.add_task(batches.validate_and_expand, batch.id, config)
    return BatchObject.from_row(batch)


@router.get("", response_model=ListObject[BatchObject])
def list_batches(after: str | None = None, limit: int = Query(default=20, ge=1, le=100),
                 who: Caller = Depends(caller),
                 session: Session = Depends(db_session)) -> ListObject[BatchObject]:
    rows, has_more = batches.list_batches(session, who.tenant_id, after=after, limit=limit)
    return ListObject[BatchObject].of([BatchObject.from_row(b) for b in rows], has_more)


@router.get("/{batch_id}", response_model=BatchObject)
def get_batch(batch_id: str, who: Caller = Depends(caller),
              session: Session = Depends(db_session)) -> BatchObject:
    return BatchObject.from_row(batches.get_batch(session, who.tenant_id, batch_id))


@router.post("/{batch_id}/cancel", response_model=BatchObject)
def cancel_batch(batch_id: str, who: Caller = Depends(caller),
                 session: Session = Depends(db_session)) -> BatchObject:
    return BatchObject.from_row(batches.cancel_batch(session, who.tenant_id, batch_id))
