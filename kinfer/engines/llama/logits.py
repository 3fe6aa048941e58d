"""A row's logits between `llama_decode` and its sampler chain: logit_bias and the grammar's mask are
written into llama.cpp's own buffer (the chain reads it next), and the logprobs are read from it.

Only rows that ask pay: a row without bias, constraint or logprobs never has its logits touched.
"""

from __future__ import annotations

import numpy as np

from kinfer.constrain.runtime import GrammarVocab, MaskTable
from kinfer.engines.llama import native
from kinfer.engines.llama.grammar import grammar_vocab
from kinfer.engines.llama.rows import Row
from kinfer.engines.logprobs import record, top_indices
from kinfer.protocol import TokenLogprob

_Scores = tuple[np.ndarray, float]  # a row's biased, masked logits and the log of their partition sum


class RowLogits:
    """Bias, masks and logprobs for the rows of one context (`rows` sequence ids)."""

    def __init__(self, vocab: native.Vocab, rows: int) -> None:
        self._vocab = vocab
        self._rows = rows
        self._grammar: GrammarVocab | None = None  # built with the first constrained job
        self.masks: MaskTable | None = None

    def grammar_vocab(self) -> GrammarVocab:
        if self._grammar is None:
            self._grammar = grammar_vocab(self._vocab)
            self.masks = MaskTable(self._rows, self._grammar, unpack=True)
        return self._grammar

    def prefetch(self, rows: list[Row]) -> None:
        """Start the constrained rows' masks on the helper thread (while `llama_decode` runs)."""
        if self.masks is not None:
            self.masks.prefetch([(r.seq, r.grammar) for r in rows if r.grammar is not None])

    def wait(self) -> None:
        if self.masks is not None:
            self.masks.wait()

    def prepare(self, ctx: int, row: Row, index: int) -> tuple[bool, _Scores | None]:
        """Bias and mask the logits at batch `index` for the row's draw. Returns (False, None) when the
        grammar allows nothing at all (a dead end); else (True, what the row's logprobs are read from,
        when it asks for them)."""
        if not row.touches_logits:
            return True, None
        logits = self._biased(ctx, row, index)
        alive, _ = self._mask(row, logits, lazy=False)
        return alive, self._scores(row, logits) if alive else None

    def draw_greedy(self, ctx: int, row: Row, index: int) -> tuple[bool, int, _Scores | None]:
        """The greedy draw of a row without penalties, done here: one argmax over llama.cpp's logits
        instead of `llama_sampler_sample`, which first copies the whole vocabulary into a candidate array
        (~0.5 ms a row at 150k tokens: on a GPU, the host's largest cost per step). A constrained row
        that reports no logprobs tries its best token first and applies the mask only when the grammar
        forbids that token, as llama.cpp's common sampler does. Same token as the sampler chain: the
        first of the largest logits. Returns (alive, token, logprobs' scores)."""
        logits = native.row_logits(ctx, index, self._vocab.n_tokens) if not row.touches_logits else None
        if logits is None:
            logits = self._biased(ctx, row, index)
            alive, token = self._mask(row, logits, lazy=row.job.sampling.logprobs is None)
            if not alive:
                return False, -1, None
            if token is not None:
                return True, token, None
        token = int(logits.argmax())
        return True, token, self._scores(row, logits)

    def _biased(self, ctx: int, row: Row, index: int) -> np.ndarray:
        logits = native.row_logits(ctx, index, self._vocab.n_tokens)
        if row.bias is not None:
            ids, values = row.bias
            logits[ids] += values
        return logits

    def _mask(self, row: Row, logits: np.ndarray, *, lazy: bool) -> tuple[bool, int | None]:
        """Apply the row's grammar mask to `logits`. `lazy`: when the best token is allowed, leave the
        logits alone and return that token. Returns (alive, the token a lazy check settled or None)."""
        grammar = row.grammar
        if grammar is None or not (grammar.active or grammar.blocks_eos):
            return True, None
        masks = self.masks
        assert masks is not None
        if row.pending is None and row.generated == 0:
            masks.fill([(row.seq, grammar)])  # the first token, sampled after the prompt: not prefetched
        if masks.dead_end(row.seq, grammar):
            return False, None
        if lazy:
            best = masks.best_allowed(row.seq, logits)  # a sparse mask: an argmax over its few tokens
            if best is not None:
                return True, best
            best = int(logits.argmax())
            if masks.allows(row.seq, best):
                return True, best
        np.copyto(logits, np.float32(-np.inf), where=masks.forbidden(row.seq))
        return True, None

    def _scores(self, row: Row, logits: np.ndarray) -> _Scores | None:
        if row.job.sampling.logprobs is None:
            return None
        # a copy (the draw must not be able to change what is reported) and the log of the partition
        # sum, in float64; the full log-softmax is never built, only the entries reported
        values = logits.copy()
        top = values.max()
        return values, float(top) + float(np.log(np.exp(values - top).sum(dtype=np.float64)))

    def record(self, row: Row, scores: _Scores, token: int) -> TokenLogprob:
        """The sampled token's logprob and the row's top alternatives."""
        values, log_total = scores
        top = top_indices(values, row.job.sampling.logprobs or 0)
        chosen = float(values[token]) - log_total
        return record(self._vocab.piece, token, chosen, top, values[top].astype(np.float64) - log_total)

    def close(self) -> None:
        if self.masks is not None:
            self.masks.close()
