"""The FastAPI application: `create_app()`; `quern api` serves it with uvicorn."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.body_limit import BodyLimitMiddleware
from api.errors import install_error_handlers
from api.routes import batches, files, health, jobs
from store.batches import run_maintenance
from store.db import session_scope
from store.reconcile import reconcile
from store.settings import Settings, get_settings

log = logging.getLogger(__name__)


def _maintenance_loop(settings: Settings, stop: threading.Event) -> None:
    while not stop.wait(settings.maintenance_interval_s):
        try:
            run_maintenance(settings)
        except Exception:  # a failed sweep is retried on the next tick; never kill the thread
            log.exception("maintenance sweep failed")
        try:  # SKIP LOCKED: every API process may run it; none sends a job another took
            with session_scope(settings) as session:
                report = reconcile(session, settings)
            if report.resent:
                log.warning("reconciler: %s", report.describe())
        except Exception:
            log.exception("reconciler pass failed")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        sweeper = None
        if settings.maintenance_interval_s > 0:
            sweeper = threading.Thread(target=_maintenance_loop, args=(settings, stop),
                                       name="quern-maintenance", daemon=True)
            sweeper.start()
        yield
        stop.set()
        if sweeper is not None:
            sweeper.join(timeout=5)

    app = FastAPI(title="quern", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, default_limit=settings.max_body_bytes,
                       upload_paths=("/v1/files",), upload_limit=settings.max_file_bytes)
    for module in (health, jobs, files, batches):
        app.include_router(module.router)
    return app
