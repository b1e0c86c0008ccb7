"""Decides, each step, which requests run and how many of their tokens.

One token budget per step. Running requests come first (a decode token or the next prefill
chunk), then waiting ones in (priority, arrival) order; long prompts are chunked; prefill and
decode mix in one step. When blocks run out, the lowest-priority, latest-arrived running request
is preempted by recompute: its blocks are freed and it goes back to waiting, where its cached
prefix speeds its return. A waiting request of higher priority may preempt lower ones to get in.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sequence import Request, RequestStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, new tokens)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[tuple[tuple[int, int], Request]] = []  # heap on sort_key
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        heapq.heappush(self.waiting, (req.sort_key(), req))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _chunk(self, num_new: int, budget: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0:
            num_new = min(num_new, threshold)
        return min(num_new, budget)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        scheduled: dict[Request, int] = {}

        for req in list(self.running):
            if req.status != RequestStatus.RUNNING or budget == 0:
                continue
            num_new = self._chunk(req.num_tokens - req.num_computed_tokens, budget)
            while not self.block_manager.allocate(req, num_new):
                victim = max(self.running, key=Request.sort_key)
                budget += scheduled.pop(victim, 0)
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                scheduled[req] = num_new
                budget -= num_new

        # A preemption means blocks are short: admitting more would only thrash.
        blocks_short = bool(out.preempted)
        in_flight = self._prefix_blocks_in_flight()
        deferred = []
        while self.waiting and budget > 0 and not blocks_short:
            req = self.waiting[0][1]
            if sum(map(self._seats, self.running)) + self._seats(req) > self.config.max_num_seqs:
                if not self._make_room(req, out, scheduled):
                    break
                budget = self.config.max_num_batched_tokens - sum(scheduled.values())
                continue
            cached = self.block_manager.find_cached_blocks(req)
            if self._shares_block_in_flight(req, len(cached), in_flight):
                # Its next block is being computed by another request: wait a step and hit it
                # in the cache rather than compute the same prefix twice.
                deferred.append(heapq.heappop(self.waiting))
                continue
            num_computed = len(cached) * self.block_manager.block_size
            num_new = self._chunk(req.num_tokens - num_computed, budget)
            if not self.block_manager.allocate(req, num_new, cached):
                if self._make_room(req, out, scheduled):
                    budget = self.config.max_num_batched_tokens - sum(scheduled.values())
                    continue
                break
            heapq.heappop(self.waiting)
            req.num_computed_tokens = num_computed
            if req.num_cached_tokens < 0:  # first admission: this is the prefix-cache hit
                req.num_cached_tokens = num_computed
                self.block_manager.prefix_queries += req.num_tokens
                self.block_manager.prefix_hits += num_computed
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled[req] = num_new
            budget -= num_new
            in_flight.update(self._uncomputed_prompt_blocks(req))

        for item in deferred:
            heapq.heappush(self.waiting, item)
        out.scheduled = list(scheduled.items())
        return out

    def _uncomputed_prompt_blocks(self, req: Request) -> list[int]:
        bs = self.block_manager.block_size
        return req.block_hashes[req.num_computed_tokens // bs:req.num_prompt_tokens // bs]

    def _prefix_blocks_in_flight(self) -> set[int]:
        """Hashes of full prompt blocks that running requests have yet to compute."""
        if not self.block_manager.enable_prefix_caching:
            return set()
        return {h for r in self.running if r.num_computed_tokens < r.num_prompt_tokens
                for h in self._uncomputed_prompt_blocks(r)}

    @staticmethod
    def _shares_block_in_flight(req: Request, num_cached: int, in_flight: set[int]) -> bool:
        return num_cached < len(req.block_hashes) and req.block_hashes[num_cached] in in_flight

    @staticmethod
    def _seats(req: Request) -> int:
        """Sequences ``req`` will hold: n for a prompt whose n - 1 siblings fork off it."""
        return req.params.n if req.index == 0 and req.num_output_tokens == 0 else 1

    def _make_room(self, req: Request, out: SchedulerOutput,
                   scheduled: dict[Request, int]) -> bool:
        """Preempt one running request of strictly lower priority than ``req``, if any."""
        lower = [r for r in self.running if r.priority > req.priority]
        if not lower:
            return False
        victim = max(lower, key=Request.sort_key)
        scheduled.pop(victim, None)
        self._preempt(victim, out)
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(req)
        self.add(req)

    def finish(self, req: Request) -> None:
        """Drop a finished (or aborted) request from wherever it is and free its blocks."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.WAITING:
            self.waiting = [(k, r) for k, r in self.waiting if r is not req]
            heapq.heapify(self.waiting)
        self.block_manager.free(req)
        req.status = RequestStatus.FINISHED
