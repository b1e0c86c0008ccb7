"""`quern run`: an OpenAI Batch input file through the engine, offline, with no services.

The input is streamed: at most ``window`` requests are held at once, so memory stays bounded
whatever the file's size. Results are appended as they finish (not in input order, like the
OpenAI Batch API: match them by custom_id). A bad line becomes an error line and the rest runs.
``resume`` skips custom_ids already present in the output.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson
from tqdm import tqdm

from engine import LLMEngine, PromptTooLongError, RequestOutput
from engine.outputs import CompletionOutput
from store.openai_batch import (
    BatchLine,
    BatchLineError,
    completion_body,
    error_line,
    now,
    output_line,
    parse_batch_line,
)
from worker.params import logprobs_entries, sampling_params_from_body


@dataclass
class RunSummary:
    total: int = 0
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    elapsed: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        rate = self.completion_tokens / self.elapsed if self.elapsed else 0.0
        text = (f"{self.completed} completed, {self.failed} failed, {self.skipped} skipped of "
                f"{self.total} lines in {self.elapsed:.1f}s; {self.prompt_tokens} prompt tokens "
                f"({self.cached_tokens} cached), {self.completion_tokens} completion tokens "
                f"({rate:.1f}/s)")
        if self.errors:
            text += "; errors: " + ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items()))
        return text


@dataclass
class _InFlight:
    line: BatchLine
    output: RequestOutput
    created: int


def read_done_ids(path: Path) -> set[str]:
    """custom_ids already written to ``path``; a torn last line (a crash mid-write) is cut."""
    done: set[str] = set()
    if not path.exists():
        return done
    with open(path, "rb+") as f:
        good_end = 0
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                custom_id = orjson.loads(raw).get("custom_id")
            except orjson.JSONDecodeError:
                break
            if custom_id is not None:
                done.add(custom_id)
            good_end += len(raw)
        f.truncate(good_end)
    return done


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if raw.strip():
                yield line_no, raw


def run_batch_file(input_path: Path, output_path: Path, *, model: str = "smollm2",
                   resume: bool = False, dtype: str | None = None, window: int = 256,
                   engine: LLMEngine | None = None, progress: bool = True,
                   **engine_config) -> RunSummary:
    input_path, output_path = Path(input_path), Path(output_path)
    done = read_done_ids(output_path) if resume else set()
    if not resume and output_path.exists():
        output_path.unlink()
    if engine is None:
        engine = LLMEngine.from_model(model, dtype=dtype, **engine_config)
    runner = _Runner(engine, done)
    started = time.monotonic()
    with open(output_path, "ab") as out, tqdm(total=count_lines(input_path), unit="req",
                                              disable=not progress, desc="quern run") as bar:
        runner.run(iter_lines(input_path), out, window, bar)
    runner.summary.elapsed = time.monotonic() - started
    return runner.summary


class _Runner:
    def __init__(self, engine: LLMEngine, done: set[str]):
        self.engine = engine
        self.done = done
        self.seen: set[str] = set()
        self.in_flight: dict[str, _InFlight] = {}
        self.summary = RunSummary()

    def run(self, lines: Iterator[tuple[int, bytes]], out: IO[bytes], window: int,
            bar: tqdm) -> None:
        exhausted = False
        while not exhausted or self.engine.has_unfinished_requests():
            while not exhausted and len(self.in_flight) < window:
                item = next(lines, None)
                if item is None:
                    exhausted = True
                    break
                self.summary.total += 1
                if not self._submit(*item, out):
                    bar.update(1)
            for inc in self.engine.step():
                flight = self.in_flight[inc.request_id]
                flight.output.add(inc)
                if flight.output.finished:
                    del self.in_flight[inc.request_id]
                    self._write_result(flight, out)
                    bar.update(1)

    def _fail(self, out: IO[bytes], err: BatchLineError) -> None:
        self.summary.failed += 1
        self.summary.errors[err.code] = self.summary.errors.get(err.code, 0) + 1
        _write(out, error_line(err.custom_id, err.code, err.message, param=err.param,
                              line=err.line_no))

    def _submit(self, line_no: int, raw: bytes, out: IO[bytes]) -> bool:
        """Start one line; False when it is finished at once (an error, or skipped)."""
        try:
            line = parse_batch_line(raw, line_no)
        except BatchLineError as err:
            self._fail(out, err)
            return False
        if line.custom_id in self.done:
            self.summary.skipped += 1
            return False
        if line.custom_id in self.seen:
            self._fail(out, BatchLineError(line_no, "duplicate_custom_id",
                                           f"custom_id {line.custom_id!r} appears earlier in "
                                           "the file", "custom_id", line.custom_id))
            return False
        self.seen.add(line.custom_id)
        request_id = uuid.uuid4().hex
        try:
            params = sampling_params_from_body(line.body)
            self.engine.add_request(request_id, line.body.prompt_input(), params)
        except PromptTooLongError as exc:
            self._fail(out, BatchLineError(line_no, exc.code, str(exc), "body", line.custom_id))
            return False
        except ValueError as exc:
            self._fail(out, BatchLineError(line_no, "invalid_request", str(exc), "body",
                                           line.custom_id))
            return False
        prompt_ids = self.engine.requests[request_id][0].prompt_token_ids
        self.in_flight[request_id] = _InFlight(
            line, RequestOutput(request_id, prompt_ids,
                                [CompletionOutput(i) for i in range(params.n)]), now())
        return True

    def _write_result(self, flight: _InFlight, out: IO[bytes]) -> None:
        result = flight.output
        choices = [{"text": o.text, "finish_reason": o.finish_reason,
                    "num_tokens": len(o.token_ids), "logprobs": logprobs_entries(o.logprobs)}
                   for o in result.outputs]
        body = completion_body(
            flight.line.url, request_id=result.request_id,
            model=flight.line.body.model or self.engine.model_name, created=flight.created,
            choices=choices, prompt_tokens=len(result.prompt_token_ids),
            cached_tokens=result.num_cached_tokens)
        usage = body["usage"]
        self.summary.completed += 1
        self.summary.prompt_tokens += usage["prompt_tokens"]
        self.summary.completion_tokens += usage["completion_tokens"]
        self.summary.cached_tokens += result.num_cached_tokens
        _write(out, output_line(flight.line.custom_id, request_id=result.request_id, body=body))


def _write(out: IO[bytes], line: dict) -> None:
    out.write(orjson.dumps(line) + b"\n")
    out.flush()
