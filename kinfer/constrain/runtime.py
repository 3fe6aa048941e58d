"""Grammar state per row and token masks per step, shared by the llama.cpp and MLX engines.

An engine owns one `GrammarVocab` (its vocabulary as llguidance sees it, built on first use, plus the
grammars compiled for it, cached by their text) and one `MaskTable` (a bitmask row per engine row). A
constrained row holds a `RowGrammar`: every token the row samples goes through `accept` (stop strings
may still hold its text back: the grammar has seen it); before each draw the engine asks the table
for the row's mask and sets every token it forbids to -inf on the row's logits.

Masks are computed on the CPU (llguidance releases the GIL meanwhile), one row after another: tens of
microseconds each, so an engine computes them while the device runs the step's forward pass.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from kinfer.constrain.library import LLMatcher, LLTokenizer, fill_next_token_bitmask
from kinfer.constrain.spec import Constraint
from kinfer.errors import InvalidRequest

log = logging.getLogger(__name__)

COMPILED_GRAMMARS = 64  # compiled grammars kept per engine (an agent's tools compile once)
SPARSE_WORDS = 64  # a mask with at most this many non-zero words (2,048 tokens) is kept as its ids


class GrammarVocab:
    """One engine's vocabulary for llguidance, built on first use (about a second), and its grammars.

    `make_tokenizer` builds the `LLTokenizer` (see the engines' grammar modules); `eos` are the tokens
    that end a reply, allowed once a grammar is complete."""

    def __init__(self, make_tokenizer: Callable[[], LLTokenizer], n_vocab: int, eos: Iterable[int]) -> None:
        self._make_tokenizer = make_tokenizer
        self._tokenizer: LLTokenizer | None = None
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()
        self.n_vocab = n_vocab
        self.eos = tuple(sorted(set(eos)))

    @property
    def tokenizer(self) -> LLTokenizer:
        if self._tokenizer is None:
            started = time.perf_counter()
            self._tokenizer = self._make_tokenizer()
            log.info("grammar vocabulary built in %.2fs", time.perf_counter() - started)
        return self._tokenizer

    def start(self, constraint: Constraint) -> RowGrammar | None:
        """A fresh grammar state for one row. A lazy grammar (tools on "auto") that does not compile for
        this vocabulary leaves the row free (None) rather than refuse it; any other raises."""
        try:
            return RowGrammar(self, constraint)
        except InvalidRequest as exc:
            if constraint.trigger is None:
                raise
            log.warning("tool calls left unconstrained: %s", exc)
            return None

    def matcher(self, grammar: str) -> LLMatcher:
        """A fresh matcher for `grammar`, compiled once and copied after that."""
        template = self._compiled.get(grammar)
        if template is None:
            template = LLMatcher(self.tokenizer, grammar, log_level=0)
            if template.is_error():
                raise InvalidRequest(f"the output constraint could not be compiled: {template.get_error()}")
            self._compiled[grammar] = template
            if len(self._compiled) > COMPILED_GRAMMARS:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(grammar)
        return template.deep_copy()


class RowGrammar:
    """Where one row stands in its grammar.

    `active`: the grammar decides the next token. Before that the row is free: it waits for
    `start_after` (the think closer), then, for a lazy grammar, for the trigger. `ended`: the grammar
    is complete (only the end of the reply may follow) or the reply left it (`error` says how)."""

    __slots__ = (
        "_may_think",
        "_pending",
        "_start_after",
        "_trigger",
        "_vocab",
        "active",
        "ended",
        "error",
        "matcher",
    )

    def __init__(self, vocab: GrammarVocab, constraint: Constraint) -> None:
        self._vocab = vocab
        self.matcher = vocab.matcher(constraint.grammar)
        self._start_after = constraint.start_after.encode() if constraint.start_after else None
        self._trigger = constraint.trigger.encode() if constraint.trigger else None
        # a lazy grammar lets the reply open a think block of its own first (a call inside is thought)
        think = constraint.think if self._trigger is not None and self._start_after is None else None
        self._may_think = (think[0].encode(), think[1].encode()) if think else None
        self._pending = b""  # the reply's bytes not yet matched against a marker
        self.active = self._start_after is None and self._trigger is None
        self.ended = False
        self.error: str | None = None

    @property
    def blocks_eos(self) -> bool:
        """A forced grammar still waiting for the think block to close: the reply may not end there."""
        return not self.active and not self.ended and self._trigger is None

    def accept(self, token: int, piece: bytes) -> None:
        """The row sampled `token`, whose text is `piece`."""
        if self.ended:
            return
        if self.active:
            if not self.matcher.consume_token(token):
                self.fail()
            else:
                self._check_end()
            return
        self._scan(piece)

    def _scan(self, piece: bytes) -> None:
        seen = self._pending + piece
        if self._may_think is not None:
            opener, closer = self._may_think
            head = seen.lstrip()
            if opener.startswith(head):  # nothing yet, or part of the opener: wait
                self._pending = seen
                return
            self._may_think = None
            if head.startswith(opener):
                self._start_after = closer
                seen = head[len(opener) :]
        if self._start_after is not None:
            at = seen.find(self._start_after)
            if at < 0:
                self._pending = _tail(seen, len(self._start_after))
                return
            seen = seen[at + len(self._start_after) :]
            self._start_after = None
            if self._trigger is None:
                # the answer starts here: whitespace after the closer is the template's, not the grammar's
                self._activate(seen.lstrip())
                return
        assert self._trigger is not None
        at = seen.find(self._trigger)
        if at < 0:
            self._pending = _tail(seen, len(self._trigger))
            return
        self._activate(seen[at:])

    def _activate(self, already: bytes) -> None:
        """The grammar starts; `already` is what the reply wrote of it within the last token."""
        self.active = True
        self._pending = b""
        if not already:
            return
        tokens = self._vocab.tokenizer.tokenize_bytes(already)
        if not self.matcher.consume_tokens(tokens):
            self.fail()
        else:
            self._check_end()

    def _check_end(self) -> None:
        if self.matcher.is_error():
            self.fail()
        elif self.matcher.is_stopped():
            self.ended = True

    def fail(self) -> None:
        """The reply left the grammar (or the grammar cannot go on): end the row with an error."""
        self.ended = True
        self.error = f"the reply left its grammar ({self.matcher.get_error() or 'no token could follow'})"


def _tail(data: bytes, marker_length: int) -> bytes:
    # only the last marker_length - 1 bytes can still be the start of the marker
    return data[max(0, len(data) - marker_length + 1) :] if marker_length > 1 else b""


class MaskTable:
    """A token bitmask per engine row: bit t of row r (word t // 32, bit t % 32) = token t may come next.

    `fill` computes masks for the rows given; `prefetch` runs `fill` on a helper thread (for an engine
    whose forward pass releases the GIL) and `wait` joins it. `seconds` counts the CPU time spent.
    `unpack`: for an engine that masks logits on the host. A sparse mask (at most SPARSE_WORDS words
    with a bit set: JSON punctuation, keys, enums, numbers) is kept as the sorted ids it allows, so a
    greedy draw is one argmax over those logits (`best_allowed`); a dense one (free text inside a
    string) is laid out as one boolean per token (`forbidden`), which costs more than the mask itself
    and is done on the helper thread too. A sparse mask is laid out only if `forbidden` asks."""

    def __init__(
        self, rows: int, vocab: GrammarVocab, *, unpack: bool = False, sparse_words: int = SPARSE_WORDS
    ) -> None:
        self._vocab = vocab
        self._sparse_words = sparse_words
        self.words = np.full((rows, (vocab.n_vocab + 31) // 32), -1, dtype=np.int32)
        self._forbidden = np.zeros((rows, vocab.n_vocab), dtype=bool) if unpack else None
        # per row: the allowed ids of a sparse mask (None: dense), and whether `_forbidden` is current
        self._sparse: list[np.ndarray | None] = [None] * rows
        self._laid_out = [False] * rows
        self._thread: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self.seconds = 0.0  # CPU time spent computing masks, for stats and benchmarks
        self.filled = 0  # masks computed

    def fill(self, rows: Iterable[tuple[int, RowGrammar]]) -> None:
        """Compute the next-token masks of these (slot, grammar) rows."""
        started = time.thread_time()
        for slot, grammar in rows:
            if grammar.active and not grammar.ended:
                if grammar.matcher.is_error():
                    grammar.fail()  # its mask would offer only the end of the reply
                    continue
                fill_next_token_bitmask(grammar.matcher, self.words, slot)
                self.filled += 1
                self._unpack(slot)
            elif grammar.blocks_eos:
                bits = self.words[slot].view(np.uint32)
                bits[:] = 0xFFFFFFFF
                for token in self._vocab.eos:
                    bits[token // 32] &= np.uint32(~(1 << (token % 32)) & 0xFFFFFFFF)
                self._unpack(slot)
        self.seconds += time.thread_time() - started

    def prefetch(self, rows: list[tuple[int, RowGrammar]]) -> None:
        if not rows:
            return
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="kinfer-mask")
        self._pending = self._thread.submit(self.fill, rows)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _unpack(self, slot: int) -> None:
        if self._forbidden is None:
            return
        self._laid_out[slot] = False
        words = self.words[slot].view(np.uint32)
        used = np.flatnonzero(words)
        if len(used) <= self._sparse_words:
            bits = np.unpackbits(words[used].view(np.uint8), bitorder="little").reshape(len(used), 32)
            ids = (used[:, None] * 32 + np.arange(32))[bits.view(bool)]
            self._sparse[slot] = ids[ids < self._vocab.n_vocab]
        else:
            self._sparse[slot] = None
            self._lay_out(slot)

    def _lay_out(self, slot: int) -> None:
        assert self._forbidden is not None
        bits = np.unpackbits((~self.words[slot]).view(np.uint8), bitorder="little")
        self._forbidden[slot] = bits[: self._vocab.n_vocab].view(bool)
        self._laid_out[slot] = True

    def forbidden(self, slot: int) -> np.ndarray:
        """Row `slot`'s mask as one boolean per token, True = forbidden (a table built with `unpack`)."""
        assert self._forbidden is not None
        if not self._laid_out[slot]:
            self._lay_out(slot)
        return self._forbidden[slot]

    def best_allowed(self, slot: int, logits: np.ndarray) -> int | None:
        """The greedy pick under row `slot`'s sparse mask: the first of the largest logits among the
        tokens it allows. None when the mask is dense (or the table was not built with `unpack`)."""
        ids = self._sparse[slot] if self._forbidden is not None else None
        if ids is None or not len(ids):
            return None
        return int(ids[int(np.argmax(logits[ids]))])

    def allows(self, slot: int, token: int) -> bool:
        """Whether row `slot`'s mask lets `token` come next."""
        return bool((int(self.words[slot, token >> 5]) >> (token & 31)) & 1)

    def allowed(self, slot: int, n_vocab: int) -> np.ndarray:
        """Row `slot`'s mask as booleans over the first `n_vocab` tokens."""
        return np.unpackbits(self.words[slot].view(np.uint8), bitorder="little")[:n_vocab].astype(bool)

    def dead_end(self, slot: int, grammar: RowGrammar) -> bool:
        """The grammar cannot go on: it failed, or no token at all may follow."""
        if not grammar.ended and not self.words[slot].any():
            grammar.error = "the grammar allows no next token"
            grammar.ended = True
        return grammar.ended

    def close(self) -> None:
        self.wait()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
