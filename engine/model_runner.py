"""Builds the model, sizes the paged KV cache, flattens each step's batch and runs it."""

from __future__ import annotations

import numpy as np
import torch

from engine.config import EngineConfig
from engine.layers.attention import AttentionMetadata, forward_context
from engine.models.llama import SUPPORTED_MODEL_TYPES, LlamaForCausalLM
from engine.sequence import Request
from kernels import use_triton
from kernels.paged_decode_compiled import CASCADE_MIN_SEQS, plan_paged_decode

GIB = 1024 ** 3


class ModelRunner:
    def __init__(self, hf_config, state_dict, config: EngineConfig, dtype: torch.dtype,
                 device: torch.device, max_model_len: int):
        if hf_config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model type {hf_config.model_type!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        self.config = config
        self.dtype = dtype
        self.device = device
        self.block_size = config.block_size
        self.kernels = config.kernels
        with torch.device("meta"):
            model = LlamaForCausalLM(hf_config, max_model_len, self.kernels)
        model = model.to_empty(device=device)
        model.init_rope(max_model_len)  # a buffer, not a weight: built after the meta phase
        model.load_hf_state_dict(state_dict)
        self.model = model.to(dtype).eval()
        self.model.cos_sin_cache = self.model.cos_sin_cache.float()  # rotary math in float32
        if device.type == "cpu":
            # Compiled, inductor lays the layers' weights out itself (freezing).
            self.model.pack_for_cpu(layers=not config.compile_model)
        self.max_model_len = max_model_len
        attn = self.model.layers[0].self_attn
        self.num_layers = len(self.model.layers)
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.cache_dtype = self._cache_dtype()
        self.num_blocks = self._num_kv_blocks()
        shape = (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.cache_dtype, device=device),
                           torch.zeros(shape, dtype=self.cache_dtype, device=device))
                          for _ in range(self.num_layers)]
        # A compiled forward runs decode-only steps' attention in its graph, on the torch path.
        self.decode_in_graph = (config.compile_model
                                and not use_triton(self.kv_caches[0][0], self.kernels))
        if config.compile_model:
            for cache in (t for pair in self.kv_caches for t in pair):
                for dim in (1, 2, 3):  # block size and head shape: constants in the graph
                    torch._dynamo.mark_static(cache, dim)
        self.forward = self._compile() if config.compile_model else self.model

    def _compile(self):
        """torch.compile the forward and compile it now rather than in the first steps (see
        `_warm_up_steps`)."""
        # Imported here: importing inductor also imports Triton its own way, which breaks the
        # Triton interpreter (TRITON_INTERPRET=1) for the rest of the process.
        from torch._inductor import config as inductor_config
        from torch.fx.experimental import _config as fx_config

        compiled = torch.compile(self.model.forward, dynamic=True, fullgraph=True)

        def forward(ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
            # No duck sizing: two sizes that happen to be equal while tracing (a batch of 3 and
            # a table 3 blocks wide) must not become one symbol, and a recompile when they part.
            with (forward_context(meta), inductor_config.patch(freezing=True),
                  fx_config.patch(use_duck_shape=False)):
                return compiled(ids, positions, kv_caches, meta)

        with torch.inference_mode():
            for meta in self._warm_up_steps():
                ids, positions = (torch.zeros_like(meta.slot_mapping) for _ in range(2))
                forward(ids, positions, self.kv_caches, meta)
        return forward

    def _warm_up_steps(self) -> list[AttentionMetadata]:
        """Steps that between them compile every graph: one token (dynamic shapes specialize a
        size of 1), a two-token prefill, decode tokens of 2 sequences, and of enough sequences
        sharing their first blocks for the decode kernel's cascade. They read and write only
        the first few blocks, which nothing holds yet at start-up."""
        bs = self.block_size
        shared = max(0, min(4, self.num_blocks - 1))

        def step(query_lens: list[int], table: list[int], seq_len: int) -> AttentionMetadata:
            n = len(query_lens)
            slots = (list(range(seq_len - query_lens[0], seq_len)) if n == 1
                     else [seq_len - 1] * n)
            return self._metadata(slots, np.array([table] * n), np.array([seq_len] * n),
                                  np.array([0, *np.cumsum(query_lens)]))

        return [step([1], [0], 1), step([2], [0], 2), step([1, 1], [0], 1),
                step([1] * CASCADE_MIN_SEQS, list(range(shared + 1)), shared * bs + 1)]

    def _cache_dtype(self) -> torch.dtype:
        if self.config.kv_cache_dtype != "auto":
            return getattr(torch, self.config.kv_cache_dtype)
        return self.dtype

    def bytes_per_block(self) -> int:
        element = torch.tensor([], dtype=self.cache_dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element

    def _num_kv_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if self.device.type == "cuda":
            budget = self._profile_cuda_budget()
        else:
            budget = int(self.config.kv_cache_memory_gb * GIB)
        num_blocks = budget // self.bytes_per_block()
        if num_blocks < 1:
            raise ValueError("the KV cache budget holds not even one block; raise it")
        return int(num_blocks)

    def _profile_cuda_budget(self) -> int:
        """Run one forward of a full token budget, then take a fraction of what is left."""
        n, bs = self.config.max_num_batched_tokens, self.block_size
        num_blocks = -(-n // bs)
        shape = (num_blocks, bs, self.num_kv_heads, self.head_dim)
        scratch = [(torch.zeros(shape, dtype=self.cache_dtype, device=self.device),
                    torch.zeros(shape, dtype=self.cache_dtype, device=self.device))
                   for _ in range(self.num_layers)]

        def ints(values, dtype=torch.int32) -> torch.Tensor:
            return torch.as_tensor(values, dtype=dtype, device=self.device)

        meta = AttentionMetadata(
            slot_mapping=torch.arange(n, device=self.device),
            block_tables=torch.arange(num_blocks, dtype=torch.int32, device=self.device)[None],
            seq_lens=ints([n]), query_start_loc=ints([0, n]),
            max_query_len=n, max_seq_len=n, kernels=self.kernels)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        with torch.inference_mode():
            positions = torch.arange(n, device=self.device) % self.max_model_len
            hidden = self.model(torch.zeros_like(positions), positions, scratch, meta)
            self.model.compute_logits(hidden[:self.config.max_num_seqs])
        torch.cuda.synchronize(self.device)
        del scratch, hidden
        _, total = torch.cuda.mem_get_info(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        return max(0, int(total * self.config.gpu_memory_utilization) - peak)

    def prepare(self, scheduled: list[tuple[Request, int]]):
        """Flatten the step: input ids, positions, attention metadata, and the indices of the
        tokens whose logits are sampled (the last token of each request that completes)."""
        bs = self.block_size
        num_seqs = len(scheduled)
        starts = np.fromiter((r.num_computed_tokens for r, _ in scheduled), np.int64, num_seqs)
        counts = np.fromiter((n for _, n in scheduled), np.int64, num_seqs)
        seq_lens = starts + counts
        query_start_loc = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(counts, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])

        input_ids: list[int] = []
        max_blocks = max(len(r.block_table) for r, _ in scheduled)
        block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int64)
        for i, (req, n) in enumerate(scheduled):
            start = req.num_computed_tokens
            input_ids.extend(req.token_ids[start:start + n])
            block_tables[i, :len(req.block_table)] = req.block_table
        seq_index = np.repeat(np.arange(num_seqs), counts)
        positions = np.arange(num_tokens) - np.repeat(query_start_loc[:-1] - starts, counts)
        slot_mapping = block_tables[seq_index, positions // bs] * bs + positions % bs

        sampled = [i for i, (req, n) in enumerate(scheduled)
                   if req.num_computed_tokens + n == req.num_tokens]
        logits_indices = query_start_loc[1:][sampled] - 1

        meta = self._metadata(slot_mapping, block_tables, seq_lens, query_start_loc)
        ids = torch.tensor(input_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        return ids, self._to_device(positions), meta, self._to_device(logits_indices), sampled

    def _to_device(self, a: np.ndarray, dtype=torch.int64) -> torch.Tensor:
        return torch.from_numpy(a).to(device=self.device, dtype=dtype, non_blocking=True)

    def _metadata(self, slot_mapping, block_tables: np.ndarray, seq_lens: np.ndarray,
                  query_start_loc: np.ndarray) -> AttentionMetadata:
        counts = np.diff(query_start_loc)
        meta = AttentionMetadata(
            slot_mapping=self._to_device(np.asarray(slot_mapping)),
            block_tables=self._to_device(block_tables, torch.int32),
            seq_lens=self._to_device(seq_lens, torch.int32),
            query_start_loc=self._to_device(query_start_loc, torch.int32),
            max_query_len=int(counts.max()),
            max_seq_len=int(seq_lens.max()),
            kernels=self.kernels,
        )
        if self.decode_in_graph and counts.max() == 1:
            meta.decode = plan_paged_decode(meta.block_tables, seq_lens.tolist(),
                                            self.block_size)
        return meta

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks (copy on write for forked requests), in every layer."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache[dst] = k_cache[src]
            v_cache[dst] = v_cache[src]

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Request, int]]):
        """Run one forward; returns (logits [num_sampled, vocab] float32, sampled indices into
        ``scheduled``)."""
        ids, positions, meta, logits_indices, sampled = self.prepare(scheduled)
        hidden = self.forward(ids, positions, self.kv_caches, meta)
        return self.model.compute_logits(hidden[logits_indices]), sampled
