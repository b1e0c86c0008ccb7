"""The one engine of a worker process, owned by one thread for the life of the process.

Celery's task threads never touch the engine: they ``submit`` requests and ``abort`` them
through a thread-safe inbox and wait on the returned futures. The host thread alone calls
``add_request``, ``step`` and ``abort``, gathers increments into ``RequestOutput``s, resolves
each future with the finished output, and hands coalesced progress to a ``publish`` callback
at most every ``publish_interval_s`` (plus once when a request finishes), so a subscriber
gets a few messages a second per job rather than one per token.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from engine import CompletionOutput, LLMEngine, RequestOutput, SamplingParams

log = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """The engine failed while the request was in flight (not the request's fault)."""

    code = "engine_error"


@dataclass(frozen=True)
class Delta:
    index: int  # which of the request's n outputs
    text: str  # new text since the last publish
    offset: int  # where ``text`` starts in the output's text, so repeats can be dropped
    finished: bool
    finish_reason: str | None


@dataclass(frozen=True)
class Update:
    """Coalesced progress of one request: the new text, and every output's text so far."""

    request_id: str
    deltas: list[Delta]
    outputs: list[tuple[str, str | None]]  # (text so far, finish_reason) per output index


@dataclass
class _Submission:
    request_id: str
    prompt: Any
    params: SamplingParams
    priority: int
    cache_salt: str | None


@dataclass
class _Live:
    output: RequestOutput
    future: Future[RequestOutput]
    unpublished: dict[int, str] = field(default_factory=dict)  # index -> text not yet sent
    newly_finished: set[int] = field(default_factory=set)


_STOP = object()


class EngineHost:
    def __init__(self, engine: LLMEngine, publish: Callable[[list[Update]], None] | None = None,
                 publish_interval_s: float = 0.25):
        self.engine = engine
        self.publish = publish
        self.publish_interval_s = publish_interval_s
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._futures: dict[str, Future[RequestOutput]] = {}  # submitted, not yet resolved
        self._live: dict[str, _Live] = {}  # host thread only
        self._thread = threading.Thread(target=self._run, name="engine-host", daemon=True)

    # -- any thread ------------------------------------------------------------------------

    def start(self) -> EngineHost:
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._inbox.put(_STOP)
        self._thread.join(timeout)

    def submit(self, request_id: str, prompt: Any, params: SamplingParams, *, priority: int = 0,
               cache_salt: str | None = None) -> Future[RequestOutput]:
        """A future for the finished output. It raises PromptTooLongError or ValueError for a
        request the engine rejects, EngineError when the engine fails. A request id already
        in flight (a redelivered message) shares the first submission's future."""
        with self._lock:
            future = self._futures.get(request_id)
            if future is not None:
                return future
            future = self._futures[request_id] = Future()
        self._inbox.put(_Submission(request_id, prompt, params, priority, cache_salt))
        return future

    def abort(self, request_id: str) -> None:
        """Stop a request; its future resolves with finish_reason "abort"."""
        self._inbox.put(("abort", request_id))

    # -- the host thread -------------------------------------------------------------------

    def _run(self) -> None:
        next_publish = time.monotonic() + self.publish_interval_s
        while True:
            busy = self.engine.has_unfinished_requests()
            if not self._take_commands(block=not busy):
                break
            if not self.engine.has_unfinished_requests():
                continue
            try:
                increments = self.engine.step()
            except Exception as exc:  # an engine bug or CUDA error: fail what is in flight
                log.exception("engine step failed; failing %d requests", len(self._live))
                self._fail_live(EngineError(f"the engine failed: {exc!r}"))
                continue
            finished = []
            for inc in increments:
                live = self._live.get(inc.request_id)
                if live is None:
                    continue
                live.output.add(inc)
                if inc.text:
                    live.unpublished[inc.index] = live.unpublished.get(inc.index, "") + inc.text
                if inc.finished:
                    live.newly_finished.add(inc.index)
                if live.output.finished:
                    finished.append(inc.request_id)
            now = time.monotonic()
            if now >= next_publish:
                self._publish(list(self._live))
                next_publish = now + self.publish_interval_s
            else:
                self._publish(finished)
            for request_id in finished:
                self._resolve(request_id)
        stopped = EngineError("the worker is shutting down")
        self._fail_live(stopped)
        with self._lock:
            never_taken, self._futures = self._futures, {}
        for future in never_taken.values():
            future.set_exception(stopped)

    def _take_commands(self, block: bool) -> bool:
        """Apply queued submissions and aborts; False once asked to stop."""
        try:
            item = self._inbox.get(timeout=None) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if item is _STOP:
                return False
            if isinstance(item, _Submission):
                self._add(item)
            else:
                self.engine.abort(item[1])
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _add(self, sub: _Submission) -> None:
        with self._lock:
            future = self._futures[sub.request_id]
        try:
            self.engine.add_request(sub.request_id, sub.prompt, sub.params,
                                    priority=sub.priority, cache_salt=sub.cache_salt)
        except Exception as exc:  # PromptTooLongError, ValueError: the request's own fault
            with self._lock:
                self._futures.pop(sub.request_id, None)
            future.set_exception(exc)
            return
        prompt_ids = self.engine.requests[sub.request_id][0].prompt_token_ids
        outputs = [CompletionOutput(i) for i in range(sub.params.n)]
        self._live[sub.request_id] = _Live(RequestOutput(sub.request_id, prompt_ids, outputs),
                                           future)

    def _publish(self, request_ids: list[str]) -> None:
        if self.publish is None:
            return
        updates = []
        for request_id in request_ids:
            live = self._live[request_id]
            if not live.unpublished and not live.newly_finished:
                continue
            outs = live.output.outputs
            deltas = []
            for index in sorted(live.unpublished.keys() | live.newly_finished):
                text = live.unpublished.get(index, "")
                out = outs[index]
                deltas.append(Delta(index, text, len(out.text) - len(text),
                                    index in live.newly_finished, out.finish_reason))
            live.unpublished.clear()
            live.newly_finished.clear()
            updates.append(Update(request_id, deltas,
                                  [(o.text, o.finish_reason) for o in outs]))
        if updates:
            try:
                self.publish(updates)
            except Exception:  # progress is best effort; the result still reaches Postgres
                log.exception("publishing progress failed")

    def _resolve(self, request_id: str) -> None:
        live = self._live.pop(request_id)
        with self._lock:
            self._futures.pop(request_id, None)
        live.future.set_result(live.output)

    def _fail_live(self, error: EngineError) -> None:
        for request_id, live in list(self._live.items()):
            try:
                self.engine.abort(request_id)
            except Exception:
                log.exception("abort of %s failed", request_id)
            with self._lock:
                self._futures.pop(request_id, None)
            live.future.set_exception(error)
        self._live.clear()
