"""The llama.cpp engine's prefix pool: recent prompts kept in spare sequence ids.

A new row adopts the saved sequence sharing the longest token prefix with its prompt (a KV copy,
no recompute), then drops the cells past the shared part. A finished row saves its prompt and reply
so the next turn of the same conversation starts warm. Recurrent state cannot be cut back, so for
recurrent/hybrid models only whole saved checkpoints are adopted (`exact_only`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from kinfer.engines.llama import native
from kinfer.engines.prefix_index import PrefixIndex, common_prefix_length

log = logging.getLogger(__name__)

# Adopting copies a whole KV stream (llama.cpp copies a stream's buffers, every cell of the row, not
# just the shared ones), which for a handful of tokens can cost more than recomputing them: the
# threshold weighs one against the other (`reuse_threshold`). Until the engine has timed a prompt
# chunk, this many shared tokens are needed.
MIN_REUSE_TOKENS = 32
LEAST_REUSE_TOKENS = 4  # however cheap the copy, a shorter match is not worth an entry
# bytes a second of a stream copy, kept low: memcpy on a CPU (7-14 GB/s measured on a 2-core EPYC),
# a device-to-device copy on a GPU
COPY_BYTES_PER_S_CPU = 5e9
COPY_BYTES_PER_S_GPU = 2e11


def reuse_threshold(stream_bytes: int, prompt_token_s: float | None, *, gpu: bool) -> int:
    """The fewest shared tokens worth adopting: where copying one KV stream of `stream_bytes` takes
    less time than prefilling that many tokens at `prompt_token_s` seconds each (None: not timed yet).

    On a CPU prefill is dear (4 ms a token of the bundled SmolLM2 on 2 cores) and a stream of a few
    hundred cells copies in a millisecond or two, so a chat template's system preamble (24 tokens for
    SmolLM2) is worth adopting; a 32,768-cell stream of the same model (~750 MB) is worth it from
    ~40 tokens."""
    if prompt_token_s is None or prompt_token_s <= 0:
        return MIN_REUSE_TOKENS
    copy_s = stream_bytes / (COPY_BYTES_PER_S_GPU if gpu else COPY_BYTES_PER_S_CPU)
    return max(LEAST_REUSE_TOKENS, math.ceil(copy_s / prompt_token_s))


class PrefixPool:
    """Saved token prefixes, one per pool sequence id, evicted least recently used first."""

    def __init__(
        self, mem: int, slots: Sequence[int], *, exact_only: bool, stream_bytes: int, gpu: bool
    ) -> None:
        """`stream_bytes`: what adopting a prefix copies (a row's whole KV stream), on a GPU or not."""
        self._mem = mem
        self._free = list(reversed(slots))
        self._index = PrefixIndex(len(slots))
        self.exact_only = exact_only
        self._stream_bytes, self._gpu = stream_bytes, gpu
        self.min_tokens = MIN_REUSE_TOKENS  # shared tokens worth a copy, as of the last adopt

    @property
    def lookups(self) -> int:
        return self._index.lookups

    @property
    def hits(self) -> int:
        return self._index.hits

    def __len__(self) -> int:
        return len(self._index)

    def entries(self) -> list[tuple[int, ...]]:
        """The saved token lists, least recently used first."""
        lru_first = self._index.keys()  # PrefixIndex is not iterable itself
        return [self._index.tokens(key) for key in lru_first]

    def adopt(self, seq: int, prompt: Sequence[int], prompt_token_s: float | None = None) -> int:
        """Fill the empty sequence `seq` with the longest saved prefix of `prompt`; returns the number
        of prompt tokens it now holds (0 when nothing useful is saved). `prompt_token_s`: what the
        engine last timed a prompt token's prefill at (None: not yet), weighed against the copy."""
        if self._index.capacity == 0:
            return 0
        self.min_tokens = reuse_threshold(self._stream_bytes, prompt_token_s, gpu=self._gpu)
        # leave at least two tokens to evaluate (a lone token takes another attention kernel, and the
        # reply would differ from a cold run's); whole checkpoints cannot be cut, so they may leave one
        candidates = prompt if self.exact_only else prompt[:-1]
        match = self._index.best(candidates, exact_only=self.exact_only, min_shared=self.min_tokens)
        if match is None:
            return 0
        native.seq_copy(self._mem, int(match.key), seq)
        if match.shared < len(self._index.tokens(match.key)) and not native.seq_trim(
            self._mem, seq, match.shared
        ):
            # the memory cannot drop the tail (recurrent state): start cold instead
            native.seq_clear(self._mem, seq)
            return 0
        log.debug("seq %d adopted %d tokens from pool slot %s", seq, match.shared, match.key)
        return match.shared

    def save(self, seq: int, tokens: Sequence[int]) -> None:
        """Keep a copy of sequence `seq`, which holds exactly `tokens`."""
        if self._index.capacity == 0 or len(tokens) < self.min_tokens:
            return
        tokens = tuple(tokens)
        extended = None
        lru_first = self._index.keys()
        for key in lru_first:
            have = self._index.tokens(key)
            shared = common_prefix_length(have, tokens)
            if have == tokens or (not self.exact_only and shared == len(tokens)):
                self._index.touch(key)  # already saved, or covered by a longer entry
                return
            if not self.exact_only and shared == len(have):
                extended = key  # the conversation went on: the longer copy replaces the shorter
        if extended is not None:
            slot = extended
        elif self._free:
            slot = self._free.pop()
        else:
            slot = self._index.lru()
        self._index.remove(slot)
        native.seq_copy(self._mem, seq, int(slot))
        self._index.put(slot, tokens)
        log.debug("pool slot %s saved %d tokens from seq %d", slot, len(tokens), seq)
