"""Webhook deliveries, signed the Standard Webhooks way, sent from background threads so
neither the step loop nor a Celery task ever waits on someone else's server.

Each POST carries ``webhook-id`` (the same on every retry: receivers dedupe on it),
``webhook-timestamp`` (unix seconds) and ``webhook-signature``: ``v1,`` + base64 of
HMAC-SHA256 over ``"{id}.{timestamp}.{body}"`` keyed with the secret (``QUERN_WEBHOOK_SECRET``,
``whsec_`` + base64, as Standard Webhooks libraries take it). 2xx is delivered; 408, 429, 5xx
and network errors are retried with exponential backoff; any other answer is final.
Deliveries live in memory: a worker that dies loses the ones still retrying.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

import httpx
import orjson
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 429}


class WebhookSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUERN_WEBHOOK_", extra="ignore")

    secret: str | None = None  # whsec_<base64>; unset: deliveries go unsigned
    max_attempts: int = 6
    backoff_s: float = 1.0  # then 2, 4, 8, ... up to backoff_max_s
    backoff_max_s: float = 60.0
    timeout_s: float = 10.0
    threads: int = 4


def secret_key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_"))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def job_event(job_id: str, status: str, *, usage: dict[str, int] | None = None,
              error: dict[str, Any] | None = None, batch_id: str | None = None,
              custom_id: str | None = None) -> dict[str, Any]:
    """The event body for a finished job (``type`` job.succeeded / job.failed)."""
    return {"type": f"job.{status}",
            "timestamp": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            "data": {"id": job_id, "object": "job", "status": status, "usage": usage,
                     "error": error, "batch_id": batch_id, "custom_id": custom_id}}


def is_deliverable(url: str) -> bool:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host)


class WebhookSender:
    def __init__(self, settings: WebhookSettings | None = None):
        self.settings = settings or WebhookSettings()
        if self.settings.secret is None:
            log.warning("QUERN_WEBHOOK_SECRET is not set: webhooks will be sent unsigned")
        self._pool = ThreadPoolExecutor(self.settings.threads, thread_name_prefix="webhook")
        self._client = httpx.Client(timeout=self.settings.timeout_s, follow_redirects=False)

    def send(self, url: str, msg_id: str, event: dict[str, Any]) -> Future[bool] | None:
        """Queue a delivery; returns at once (None for a URL that is not http(s))."""
        if not is_deliverable(url):
            log.warning("webhook %s not sent: %r is not an http(s) URL", msg_id, url)
            return None
        return self._pool.submit(self.deliver, url, msg_id, orjson.dumps(event))

    def deliver(self, url: str, msg_id: str, body: bytes) -> bool:
        """POST until delivered or out of attempts; True once a 2xx came back."""
        s = self.settings
        for attempt in range(s.max_attempts):
            if attempt:
                time.sleep(min(s.backoff_s * 2 ** (attempt - 1), s.backoff_max_s))
            try:
                status = self._client.post(url, content=body,
                                           headers=self._headers(msg_id, body)).status_code
            except httpx.HTTPError as exc:
                log.info("webhook %s attempt %d failed: %s", msg_id, attempt + 1, exc)
                continue
            if 200 <= status < 300:
                return True
            if status not in RETRYABLE_STATUS and status < 500:
                log.warning("webhook %s refused with %d; not retried", msg_id, status)
                return False
            log.info("webhook %s attempt %d got %d", msg_id, attempt + 1, status)
        log.warning("webhook %s to %s gave up after %d attempts", msg_id, url, s.max_attempts)
        return False

    def _headers(self, msg_id: str, body: bytes) -> dict[str, str]:
        timestamp = int(time.time())
        headers = {"content-type": "application/json", "webhook-id": msg_id,
                   "webhook-timestamp": str(timestamp), "user-agent": "quern-webhooks"}
        if self.settings.secret is not None:
            headers["webhook-signature"] = sign(self.settings.secret, msg_id, timestamp, body)
        return headers

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        self._client.close()
