from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams

INTERACTIVE = 0  # lower runs first
BATCH = 1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_arrival_counter = itertools.count()


@dataclass(eq=False)
class Request:
    """One sequence in the engine: its tokens, how many have KV in the cache, its blocks."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    eos_token_id: int | None
    max_tokens: int  # resolved against max_model_len
    priority: int = INTERACTIVE
    cache_salt: str | None = None
    arrival: int = field(default_factory=lambda: next(_arrival_counter))
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # prompt + output, appended in place
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # set the first time the request is scheduled
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of this request's full blocks
    num_registered_blocks: int = 0  # leading blocks of block_table entered in the prefix cache
    num_preemptions: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    generator: torch.Generator | None = None
    logprobs: list[dict] | None = None
    parent_id: str | None = None  # for the n > 1 children of one prompt
    index: int = 0

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)
        if self.params.logprobs is not None:
            self.logprobs = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)

    def sort_key(self) -> tuple[int, int]:
        """Admission order: priority first, then arrival."""
        return (self.priority, self.arrival)
