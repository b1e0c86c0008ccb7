"""Incremental detokenization with stop strings.

Each new token decodes only a short window of recent ids (the previous token or two give the
tokenizer its context for spaces and merges). Text that ends in a broken UTF-8 character waits
for the next token. Text that might be the start of a stop string is held back until it cannot
be one; a matched stop string ends the request and is cut from the output.
"""

from __future__ import annotations

REPLACEMENT_CHAR = "\ufffd"
CONTEXT_TOKENS = 5  # ids decoded before the new ones so merges and leading spaces come out right


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: list[str], include_stop: bool):
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop = include_stop
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # start of the context window
        self.read_offset = 0  # ids before this are already in `text`
        self.text = ""  # everything decoded so far, stop strings applied
        self.emitted = 0  # characters of `text` already handed out
        self.stop_reason: str | None = None

    def append(self, token_id: int) -> None:
        """Add one generated token; sets ``stop_reason`` when a stop string matched."""
        self.token_ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.token_ids[self.prefix_offset:self.read_offset],
                        skip_special_tokens=True)
        full = decode(self.token_ids[self.prefix_offset:], skip_special_tokens=True)
        if full.endswith(REPLACEMENT_CHAR) or len(full) <= len(prefix):
            return  # an incomplete UTF-8 sequence, or a token that adds no text yet
        new_text = full[len(prefix):]
        self.read_offset = len(self.token_ids)
        self.prefix_offset = max(0, self.read_offset - CONTEXT_TOKENS)
        before = len(self.text)
        self.text += new_text
        if self.stop:
            self._check_stop(before)

    def _check_stop(self, before: int) -> None:
        longest = max(len(s) for s in self.stop)
        search_from = max(0, before - longest + 1)
        best: tuple[int, str] | None = None
        for s in self.stop:
            at = self.text.find(s, search_from)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is not None:
            at, s = best
            self.text = self.text[:at + len(s)] if self.include_stop else self.text[:at]
            self.stop_reason = s

    def take(self, finished: bool) -> str:
        """The text not handed out yet, holding back a possible stop-string prefix."""
        end = len(self.text)
        if not finished and self.stop:
            end -= self._held_back()
        chunk = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return chunk

    def _held_back(self) -> int:
        tail = self.text[self.emitted:]
        for keep in range(min(len(tail), max(len(s) for s in self.stop) - 1), 0, -1):
            if any(s.startswith(tail[-keep:]) for s in self.stop):
                return keep
        return 0
