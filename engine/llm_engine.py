"""The engine: requests in, one batched step at a time, increments out.

The streaming interface the worker drives from its own thread: ``add_request``, ``step``,
``abort``, ``has_unfinished_requests``. Not thread-safe: one thread owns an engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.loader import load_hf_weights, load_tokenizer, resolve_model
from engine.model_runner import ModelRunner
from engine.outputs import Increment, TokenLogprob
from engine.sampler import sample
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import INTERACTIVE, Request, RequestStatus

DEFAULT_MAX_MODEL_LEN = 8192  # a cap on the model's own limit, so the KV pool stays useful

Prompt = str | Sequence[dict[str, Any]] | Sequence[int]


class PromptTooLongError(ValueError):
    """A request that can never fit; ``code`` is stable for API users."""

    code = "context_length_exceeded"


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16, "half": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype must be one of {', '.join(names)}, got {dtype!r}")
    return names[dtype]


class LLMEngine:
    def __init__(self, hf_config, state_dict: dict[str, torch.Tensor], tokenizer,
                 config: EngineConfig | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", model_name: str = "model"):
        self.config = config or EngineConfig()
        self.device = torch.device(device)
        self.tokenizer = tokenizer
        self.model_name = model_name
        limit = getattr(hf_config, "max_position_embeddings", DEFAULT_MAX_MODEL_LEN)
        self.max_model_len = self.config.max_model_len or min(limit, DEFAULT_MAX_MODEL_LEN)
        self.runner = ModelRunner(hf_config, state_dict, self.config, dtype, self.device,
                                  self.max_model_len)
        self.block_manager = BlockManager(self.runner.num_blocks, self.config.block_size,
                                          self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.block_manager)
        self.eos_token_id = tokenizer.eos_token_id
        self.requests: dict[str, list[Request]] = {}  # request id -> its n outputs
        self.pending: list[Increment] = []  # aborts, reported by the next step
        self.prompt_tokens_computed = 0  # prompt tokens run through the model (recomputes too)
        self.prompt_tokens_total = 0

    @classmethod
    def from_model(cls, model: str = "smollm2", dtype: str | torch.dtype | None = None,
                   device: str | None = None, **engine_config: Any) -> LLMEngine:
        source = resolve_model(model)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch_dtype = resolve_dtype(dtype, dev)
        hf_config, state = load_hf_weights(source, torch_dtype)
        return cls(hf_config, state, load_tokenizer(source), EngineConfig(**engine_config),
                   torch_dtype, dev, model_name=source.name)

    # -- requests -------------------------------------------------------------------------

    def tokenize(self, prompt: Prompt) -> list[int]:
        """A string is used as is; chat messages go through the chat template."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        items = list(prompt)
        if items and all(isinstance(t, int) for t in items):
            return items
        text = self.tokenizer.apply_chat_template(items, tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    priority: int = INTERACTIVE, cache_salt: str | None = None) -> int:
        """Queue a request; returns its prompt length. Raises PromptTooLongError or ValueError
        for a request that can never run."""
        params = params or SamplingParams()
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n must be at most max_num_seqs ({self.config.max_num_seqs}), "
                             f"got {params.n}")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        prompt_ids = self.tokenize(prompt)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        max_tokens = self._check_fits(len(prompt_ids), params)
        children = []
        for index in range(params.n):
            child_params = params
            if params.seed is not None and index:
                child_params = dataclasses.replace(params, seed=params.seed + index)
            children.append(Request(
                request_id=request_id, prompt_token_ids=prompt_ids, params=child_params,
                detokenizer=IncrementalDetokenizer(self.tokenizer, params.stop,
                                                   params.include_stop_str_in_output),
                eos_token_id=self.eos_token_id, max_tokens=max_tokens, priority=priority,
                cache_salt=cache_salt, index=index))
        self.requests[request_id] = children
        self.prompt_tokens_total += len(prompt_ids)
        # The other n - 1 are forked from the first when its prompt is computed.
        self.scheduler.add(children[0])
        return len(prompt_ids)

    def _check_fits(self, prompt_len: int, params: SamplingParams) -> int:
        limit = self.max_model_len
        wanted = params.max_tokens if params.max_tokens is not None else limit - prompt_len
        wanted = max(wanted, 1)
        if prompt_len + wanted > limit:
            raise PromptTooLongError(
                f"this model's maximum context length is {limit} tokens, but {prompt_len + wanted}"
                f" were requested ({prompt_len} in the prompt, {wanted} to generate)")
        capacity = self.block_manager.num_blocks * self.config.block_size
        if prompt_len + wanted > capacity:
            raise PromptTooLongError(
                f"{prompt_len + wanted} tokens were requested ({prompt_len} in the prompt, "
                f"{wanted} to generate) but the KV cache holds at most {capacity}")
        return wanted

    def abort(self, request_id: str, report: bool = True) -> bool:
        """Stop a request wherever it is; unless ``report`` is False, the next step reports it
        with finish_reason "abort"."""
        children = self.requests.pop(request_id, None)
        if children is None:
            return False
        for req in children:
            if not req.is_finished:
                self.scheduler.finish(req)
                req.finish_reason = "abort"
                if report:
                    self.pending.append(self._increment(req, [], None))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self.pending)

    # -- the step -------------------------------------------------------------------------

    def step(self) -> list[Increment]:
        increments, self.pending = self.pending, []
        out = self.scheduler.schedule()
        if not out.scheduled:
            return increments
        self.runner.copy_blocks(self.block_manager.pending_copies)
        self.block_manager.pending_copies.clear()
        logits, sampled = self.runner.execute(out.scheduled)
        for req, n in out.scheduled:
            start = req.num_computed_tokens
            self.prompt_tokens_computed += max(0, min(start + n, req.num_prompt_tokens) - start)
            req.num_computed_tokens += n
            self.block_manager.cache_full_blocks(req)

        rows, reqs = [], []
        for row, i in enumerate(sampled):
            req = out.scheduled[i][0]
            for member in self._with_forks(req):
                rows.append(row)
                reqs.append(member)
        if not reqs:
            return increments
        if len(rows) != len(sampled):
            logits = logits[torch.tensor(rows, device=logits.device)]
        result = sample(logits, reqs)
        for req, token, logprob in zip(reqs, result.token_ids, result.logprobs, strict=True):
            increments.append(self._append(req, token, logprob))
        return increments

    def _with_forks(self, req: Request) -> list[Request]:
        """The request, plus its n - 1 siblings forked off it once its prompt is computed."""
        children = self.requests.get(req.request_id, [req])
        if req.index != 0 or req.num_output_tokens or len(children) == 1:
            return [req]
        for child in children[1:]:
            if child.status == RequestStatus.WAITING and child.num_output_tokens == 0:
                self.block_manager.fork(req, child)
                child.num_computed_tokens = req.num_computed_tokens
                child.num_cached_tokens = req.num_cached_tokens
                child.status = RequestStatus.RUNNING
                self.scheduler.running.append(child)
        return [c for c in children if c.status == RequestStatus.RUNNING
                and c.num_output_tokens == 0]

    def _append(self, req: Request, token: int, logprob) -> Increment:
        req.append_token(token)
        params = req.params
        may_stop = req.num_output_tokens >= params.min_tokens
        if token == req.eos_token_id and not params.ignore_eos and may_stop:
            req.finish_reason = "stop"
        elif token in params.stop_token_ids and may_stop:
            req.finish_reason, req.stop_reason = "stop", token
        else:
            req.detokenizer.append(token)
            if req.detokenizer.stop_reason is not None and may_stop:
                req.finish_reason, req.stop_reason = "stop", req.detokenizer.stop_reason
            elif (req.num_output_tokens >= req.max_tokens
                  or req.num_tokens >= self.max_model_len):
                req.finish_reason = "length"
        entries = None
        if logprob is not None:
            entries = [self._token_logprob(token, logprob)]
        if req.finish_reason is not None:
            self.scheduler.finish(req)
            children = self.requests.get(req.request_id, [])
            if all(c.is_finished for c in children):
                self.requests.pop(req.request_id, None)
        return self._increment(req, [token], entries)

    def _token_logprob(self, token: int, logprob) -> TokenLogprob:
        decode = self.tokenizer.decode
        chosen, top = logprob
        return TokenLogprob(token, decode([token]), chosen,
                            [(t, decode([t]), lp) for t, lp in top])

    def _increment(self, req: Request, token_ids: list[int], logprobs) -> Increment:
        finished = req.finish_reason is not None
        return Increment(
            request_id=req.request_id, index=req.index, text=req.detokenizer.take(finished),
            token_ids=token_ids, finished=finished, finish_reason=req.finish_reason,
            stop_reason=req.stop_reason, num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            num_output_tokens=req.num_output_tokens, logprobs=logprobs)

    # -- introspection --------------------------------------------------------------------

    def stats(self) -> dict[str, float | int]:
        bm = self.block_manager
        return {
            "prefix_cache_hit_rate": bm.prefix_hits / bm.prefix_queries if bm.prefix_queries
            else 0.0,
            "kv_blocks_used": bm.num_blocks - bm.num_free_blocks,
            "kv_blocks_free": bm.num_free_blocks,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "prompt_tokens_total": self.prompt_tokens_total,
            "prompt_tokens_computed": self.prompt_tokens_computed,
        }
