"""The KV cache's block pool: allocation, reference counts and prefix caching.

A block holds ``block_size`` tokens of K and V for every layer. Full blocks are cached under a
hash chained through their parent (parent hash + the block's token ids + extra keys such as a
tenant's cache salt), so two prompts that share a prefix share its blocks. Freed blocks go to
the back of the free queue but keep their hash: a later request may still hit them, and the
front of the queue (least recently freed) is evicted first when a fresh block is needed.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from engine.sequence import Request


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    # (parent hash, extra keys, token ids): compared on a hit, so a collision is a miss
    key: tuple[int, bytes, tuple[int, ...]] | None = None


def hash_block(parent_hash: int, token_ids: list[int], extra: bytes) -> int:
    data = parent_hash.to_bytes(16, "little") + array("q", token_ids).tobytes() + extra
    return xxhash.xxh3_128_intdigest(data)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.prefix_queries = 0  # prompt tokens looked up in the cache
        self.prefix_hits = 0  # of which found
        self.pending_copies: list[tuple[int, int]] = []  # (src, dst) KV block copies to run

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix caching -------------------------------------------------------------------

    def _update_hashes(self, req: Request) -> None:
        """Extend ``req.block_hashes`` to cover every full block of its tokens."""
        bs = self.block_size
        extra = req.cache_salt.encode() if req.cache_salt else b""
        for i in range(len(req.block_hashes), req.num_tokens // bs):
            parent = req.block_hashes[-1] if req.block_hashes else 0
            req.block_hashes.append(hash_block(parent, req.token_ids[i * bs:(i + 1) * bs], extra))

    def _block_key(self, req: Request, i: int) -> tuple[int, bytes, tuple[int, ...]]:
        parent = req.block_hashes[i - 1] if i else 0
        extra = req.cache_salt.encode() if req.cache_salt else b""
        return parent, extra, tuple(req.token_ids[i * self.block_size:(i + 1) * self.block_size])

    def find_cached_blocks(self, req: Request) -> list[int]:
        """Block ids holding the longest cached prefix of ``req``, leaving at least one token
        to compute (its logits are needed to sample)."""
        if not self.enable_prefix_caching:
            return []
        self._update_hashes(req)
        hits: list[int] = []
        for i in range((req.num_tokens - 1) // self.block_size):
            block_id = self.cached.get(req.block_hashes[i])
            if block_id is None or self.blocks[block_id].key != self._block_key(req, i):
                break
            hits.append(block_id)
        return hits

    def cache_full_blocks(self, req: Request) -> None:
        """Register the blocks of ``req`` that became full and computed."""
        num_full = req.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or num_full <= req.num_registered_blocks:
            return
        self._update_hashes(req)
        for i in range(req.num_registered_blocks, num_full):
            block = self.blocks[req.block_table[i]]
            block_hash = req.block_hashes[i]
            if block.block_hash is None and block_hash not in self.cached:
                block.block_hash = block_hash
                block.key = self._block_key(req, i)
                self.cached[block_hash] = block.block_id
        req.num_registered_blocks = num_full

    # -- allocation -----------------------------------------------------------------------

    def can_allocate(self, req: Request, num_new_tokens: int, cached_blocks: list[int]) -> bool:
        num_computed = req.num_computed_tokens + len(cached_blocks) * self.block_size
        new_blocks = (self.blocks_needed(num_computed + num_new_tokens)
                      - len(req.block_table) - len(cached_blocks))
        revived = sum(1 for b in cached_blocks if self.blocks[b].ref_cnt == 0)
        return max(new_blocks, 0) + revived + self._needs_copy(req) <= len(self.free_queue)

    def _needs_copy(self, req: Request) -> int:
        """1 when the next token would be written into a partial block shared with a fork."""
        if not req.block_table or req.num_computed_tokens % self.block_size == 0:
            return 0
        return int(self.blocks[req.block_table[-1]].ref_cnt > 1)

    def allocate(self, req: Request, num_new_tokens: int, cached_blocks: list[int] = ()) -> bool:
        """Give ``req`` the blocks it needs for ``num_new_tokens`` more tokens, after taking
        ``cached_blocks`` as its prefix. False, changing nothing, when blocks run short."""
        if not self.can_allocate(req, num_new_tokens, cached_blocks):
            return False
        if self._needs_copy(req):  # copy on write: the fork keeps the shared original
            shared = self.blocks[req.block_table[-1]]
            shared.ref_cnt -= 1
            req.block_table[-1] = self._take_free_block()
            self.pending_copies.append((shared.block_id, req.block_table[-1]))
        for block_id in cached_blocks:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self.free_queue[block_id]
            block.ref_cnt += 1
            req.block_table.append(block_id)
        num_computed = req.num_computed_tokens + len(cached_blocks) * self.block_size
        for _ in range(self.blocks_needed(num_computed + num_new_tokens) - len(req.block_table)):
            req.block_table.append(self._take_free_block())
        return True

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:  # evict: its contents are about to be overwritten
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
            block.block_hash = None
            block.key = None
        block.ref_cnt = 1
        return block_id

    def fork(self, parent: Request, child: Request) -> None:
        """Let ``child`` share every block of ``parent`` (n > 1 samples of one prompt)."""
        for block_id in parent.block_table:
            self.blocks[block_id].ref_cnt += 1
        child.block_table = list(parent.block_table)
        child.num_registered_blocks = parent.num_registered_blocks

    def free(self, req: Request) -> None:
        # Tail blocks first, so a prompt's later blocks are evicted before its common head.
        for block_id in reversed(req.block_table):
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block_id] = None
        if self.pending_copies:  # a copy into a freed block (preempted this step) is moot
            freed = set(req.block_table)
            self.pending_copies = [(s, d) for s, d in self.pending_copies if d not in freed]
        req.block_table = []
        req.num_registered_blocks = 0

    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / max(1, len(self.blocks))
