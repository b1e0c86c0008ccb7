"""Random ragged batches in a paged KV cache, and the naive dense attention they must match."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    keys: list[torch.Tensor]  # per sequence, the unpaged [seq_len, num_kv_heads, head_dim]
    values: list[torch.Tensor]
    scale: float

    def args(self) -> tuple:
        return (
            self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
            self.query_start_loc, self.scale,
        )


def make_paged_batch(
    seqs: list[tuple[int, int]],
    *,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    padding: int = -1,
    seed: int = 0,
    device: str = "cpu",
) -> PagedBatch:
    """seqs: (cached prefix length, new tokens) per sequence. Blocks are handed out in a
    shuffled order from a pool with spare blocks; every cache slot no sequence owns (spare
    blocks, tails of last blocks) holds NaN, so a kernel that reads one cannot pass; block
    table entries past a sequence's blocks hold `padding`."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [prefix + new for prefix, new in seqs]
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 5
    max_blocks = max(blocks_per_seq) + 2
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    block_ids = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables = torch.full((len(seqs), max_blocks), padding, dtype=torch.int32)
    keys, values = [], []
    for s, (seq_len, n_blocks) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        mine = [block_ids.pop() for _ in range(n_blocks)]
        block_tables[s, :n_blocks] = torch.tensor(mine, dtype=torch.int32)
        key = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        value = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        for pos in range(seq_len):
            k_cache[mine[pos // block_size], pos % block_size] = key[pos]
            v_cache[mine[pos // block_size], pos % block_size] = value[pos]
        keys.append(key)
        values.append(value)
    q_lens = [new for _, new in seqs]
    num_tokens = sum(q_lens)
    q = torch.randn(num_tokens, num_kv_heads * group, head_dim, generator=gen).to(dtype)
    query_start_loc = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return PagedBatch(
        q=q.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=query_start_loc.to(device),
        keys=[k.to(device) for k in keys],
        values=[v.to(device) for v in values],
        scale=head_dim**-0.5,
    )


def dense_causal_attention(batch: PagedBatch) -> torch.Tensor:
    """Per sequence, in float64 (returned as float32), from the unpaged K/V: new token i of a
    sequence of length L with q_len new tokens sits at position L - q_len + i and sees
    positions 0..that one."""
    starts = batch.query_start_loc.tolist()
    group = batch.q.shape[1] // batch.keys[0].shape[1]
    outs = []
    for s, (key, value) in enumerate(zip(batch.keys, batch.values, strict=True)):
        q = batch.q[starts[s] : starts[s + 1]].double()
        key = key.double().repeat_interleave(group, dim=1)
        value = value.double().repeat_interleave(group, dim=1)
        seq_len, q_len = key.shape[0], q.shape[0]
        scores = torch.einsum("qhd,khd->hqk", q, key) * batch.scale
        positions = torch.arange(seq_len - q_len, seq_len, device=q.device)
        future = torch.arange(seq_len, device=q.device)[None, :] > positions[:, None]
        scores = scores.masked_fill(future, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), value))
    return torch.cat(outs).float()
