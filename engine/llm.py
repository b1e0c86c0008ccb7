from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from engine.llm_engine import LLMEngine, Prompt
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    """Offline generation over one engine: ``LLM("smollm2").generate(prompts, params)``.

    ``model`` is "smollm2" (the embedded default), a HF model directory or a .gguf file;
    ``engine_config`` takes EngineConfig's fields (max_num_seqs, kv_cache_memory_gb, ...).
    """

    def __init__(self, model: str = "smollm2", dtype: str | torch.dtype | None = None,
                 device: str | None = None, **engine_config: Any):
        self.engine = LLMEngine.from_model(model, dtype=dtype, device=device, **engine_config)
        self._next_id = 0

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = engine
        llm._next_id = 0
        return llm

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False, priority: Sequence[int] | None = None
                 ) -> list[RequestOutput]:
        """Run every prompt to completion, batched together; outputs in input order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], dict)):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        results: dict[str, RequestOutput] = {}
        order = []
        for i, (prompt, params) in enumerate(zip(prompts, sampling_params, strict=True)):
            request_id = str(self._next_id)
            self._next_id += 1
            try:
                self.engine.add_request(
                    request_id, prompt, params, priority=priority[i] if priority else 0)
            except ValueError:
                for added in order:  # all or nothing: the engine keeps none of this call
                    self.engine.abort(added, report=False)
                raise
            order.append(request_id)
            results[request_id] = RequestOutput(
                request_id, self.engine.requests[request_id][0].prompt_token_ids,
                [CompletionOutput(index) for index in range(params.n)])
        bar = tqdm(total=len(order), disable=not use_tqdm, desc="generate")
        while self.engine.has_unfinished_requests():
            for inc in self.engine.step():
                out = results[inc.request_id]
                was_done = out.finished
                out.add(inc)
                if out.finished and not was_done:
                    bar.update(1)
        bar.close()
        return [results[r] for r in order]
