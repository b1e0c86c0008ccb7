"""Partial text over Redis pub/sub, from a thread of its own so the step loop never waits
on Redis.

Per job, channel ``quern:job:{job_id}`` carries JSON messages::

    {"job_id", "index", "delta", "offset", "finished", "finish_reason"}

(``offset``: where ``delta`` starts in that output's text), and key
``quern:job:{job_id}:snapshot`` holds the text so far (with a TTL)::

    {"job_id", "outputs": [{"index", "text", "finished", "finish_reason"}, ...]}

A late subscriber SUBSCRIBEs first, then GETs the snapshot, then appends each message's
``delta`` from ``offset`` on, dropping what the snapshot already holds. Each snapshot is
written in the same MULTI/EXEC as the messages it includes. Pub/sub is at-most-once:
Postgres stays the source of truth.
"""

from __future__ import annotations

import logging
import queue
import threading

import orjson
import redis

from worker.engine_host import Update

log = logging.getLogger(__name__)

SNAPSHOT_TTL_S = 3600
_STOP = object()


def channel(job_id: str) -> str:
    return f"quern:job:{job_id}"


def snapshot_key(job_id: str) -> str:
    return f"quern:job:{job_id}:snapshot"


class RedisPublisher:
    def __init__(self, client: redis.Redis, snapshot_ttl_s: int = SNAPSHOT_TTL_S):
        self.client = client
        self.snapshot_ttl_s = snapshot_ttl_s
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    def start(self) -> RedisPublisher:
        self._thread.start()
        return self

    def publish(self, updates: list[Update]) -> None:
        """Queue updates for publishing; returns at once (the engine host's callback)."""
        self._inbox.put(updates)

    def close(self, timeout: float | None = 5.0) -> None:
        """Publish what is queued, then stop."""
        self._inbox.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _STOP:
                return
            updates = list(item)  # type: ignore[call-overload]
            stop = False
            while not stop:  # one round trip for everything already waiting
                try:
                    more = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                else:
                    updates.extend(more)  # type: ignore[arg-type]
            try:
                self._write(updates)
            except redis.RedisError:
                log.warning("publishing %d updates failed", len(updates), exc_info=True)
            if stop:
                return

    def _write(self, updates: list[Update]) -> None:
        pipe = self.client.pipeline(transaction=True)
        for update in updates:
            job_id = update.request_id
            for d in update.deltas:
                pipe.publish(channel(job_id), orjson.dumps({
                    "job_id": job_id, "index": d.index, "delta": d.text, "offset": d.offset,
                    "finished": d.finished, "finish_reason": d.finish_reason}))
            snapshot = {"job_id": job_id, "outputs": [
                {"index": i, "text": text, "finished": reason is not None,
                 "finish_reason": reason}
                for i, (text, reason) in enumerate(update.outputs)]}
            pipe.set(snapshot_key(job_id), orjson.dumps(snapshot), ex=self.snapshot_ttl_s)
        pipe.execute()
