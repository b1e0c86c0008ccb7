"""Liveness and readiness probes; no authentication."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api.deps import settings
from store.health import database_reachable, redis_reachable
from store.settings import Settings

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(config: Settings = Depends(settings)) -> JSONResponse:
    checks = {"postgres": await run_in_threadpool(database_reachable, config),
              "redis": await run_in_threadpool(redis_reachable, config)}
    ready = all(checks.values())
    return JSONResponse({"status": "ready" if ready else "unavailable",
                         "checks": {k: "ok" if v else "unreachable" for k, v in checks.items()}},
                        status_code=200 if ready else 503)
