"""The worker process: one GPU, one engine, a Celery consumer of the model's two queues.

Interactive first: the worker consumes ``quern.{model}.interactive`` then
``quern.{model}.batch``, and kombu's Redis transport is told ``queue_order_strategy:
"priority"``. Kombu then issues ``BRPOP interactive batch`` with the queues always in that
order (Redis pops from the first non-empty key), instead of its default round robin, which
rotates the queue just consumed to the back. Each of the ``concurrency`` threads holds at most
one message (prefetch 1, acks late), so a waiting interactive job is taken as soon as a
thread is free. Kombu before 5.7 kept its queues in a set and could lose that order
(celery/celery#8673, fixed by celery/kombu#2464).

Nothing here imports torch at module level: ``--device cuda:N`` must set
``CUDA_VISIBLE_DEVICES`` before torch loads.
"""

from __future__ import annotations

import logging
import os
import sys

from celery import Celery
from celery.utils.nodenames import gethostname, nodename

from store.queue import celery_app, queue_name
from store.settings import Settings, get_settings

log = logging.getLogger(__name__)


def worker_queues(model: str) -> list[str]:
    """Consumption order: interactive drained first."""
    return [queue_name(model, "interactive"), queue_name(model, "batch")]


def worker_app(settings: Settings, runner) -> Celery:
    """store.queue's app (acks late, prefetch 1), with the task bound to ``runner`` (a
    worker.tasks.JobRunner) and queues consumed in the order given."""
    from worker.tasks import register_task

    app = celery_app(settings.redis_url)
    options = dict(app.conf.broker_transport_options or {})
    options["queue_order_strategy"] = "priority"  # consumption only; producers ignore it
    app.conf.broker_transport_options = options
    app.conf.worker_pool = "threads"
    register_task(app, runner)
    _check_kombu()
    return app


def _check_kombu() -> None:
    import kombu

    if tuple(kombu.VERSION[:2]) < (5, 7):
        log.warning("kombu %s may consume queues out of order; interactive-first needs >= 5.7",
                    kombu.__version__)


def pin_device(device: str) -> str:
    """For ``cuda:N``, expose only GPU N (before torch is imported) and return the device
    torch will then call it; other devices pass through."""
    if not device.startswith("cuda:"):
        return device
    if "torch" in sys.modules:
        raise RuntimeError("pin_device must run before torch is imported")
    index = int(device.removeprefix("cuda:"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:  # already narrowed: N counts within what is visible
        os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index].strip()
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    return "cuda:0"


def serve(model: str = "smollm2", *, device: str | None = None, dtype: str | None = None,
          concurrency: int = 8, served_model_name: str | None = None, loglevel: str = "INFO",
          settings: Settings | None = None, **engine_config) -> None:
    """Load the model once, start the engine host, and consume until shut down."""
    torch_device = pin_device(device) if device else None
    import redis

    from engine import LLMEngine
    from worker.engine_host import EngineHost
    from worker.publish import RedisPublisher
    from worker.tasks import JobRunner
    from worker.webhooks import WebhookSender

    settings = settings or get_settings()
    name = served_model_name or model
    engine = LLMEngine.from_model(model, dtype=dtype, device=torch_device, **engine_config)
    log.info("loaded %s on %s", engine.model_name, engine.device)
    publisher = RedisPublisher(redis.Redis.from_url(settings.redis_url)).start()
    host = EngineHost(engine, publisher.publish).start()
    webhooks = WebhookSender()
    app = worker_app(settings, JobRunner(host, settings, webhooks))
    # The API fails fast when Redis is down; a worker holding a loaded model waits instead.
    app.conf.update(broker_connection_retry=True, broker_connection_retry_on_startup=True,
                    broker_connection_max_retries=None)
    try:
        app.Worker(queues=worker_queues(name), pool="threads", concurrency=concurrency,
                   loglevel=loglevel, hostname=nodename(f"quern-{name}", gethostname())).start()
    finally:
        host.stop()
        publisher.close()
        webhooks.close(wait=False)
