"""Logprob records and logit bias, shared by both engines (the numbers are computed by each wing)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kinfer.errors import InvalidRequest
from kinfer.protocol import Sampling, TokenLogprob, TopLogprob

Piece = Callable[[int], bytes]


def check_bias_ids(sampling: Sampling, vocab: int) -> None:
    """A logit_bias token id outside the model's vocabulary is the client's mistake: a 400."""
    for token, _bias in sampling.logit_bias:
        if not 0 <= token < vocab:
            raise InvalidRequest(f"logit_bias: token id {token} is outside the vocabulary (0..{vocab - 1})")


def bias_arrays(sampling: Sampling) -> tuple[np.ndarray, np.ndarray] | None:
    """The row's logit_bias as (ids, values) arrays, or None without one. A token named twice keeps
    the last value, as a JSON object would."""
    if not sampling.logit_bias:
        return None
    merged = dict(sampling.logit_bias)
    return np.fromiter(merged, dtype=np.int64), np.array(list(merged.values()), dtype=np.float32)


def top_indices(logprobs: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n largest values of a 1-D array, largest first (ties: lower id first)."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    part = np.argpartition(-logprobs, n - 1)[:n]
    return part[np.lexsort((part, -logprobs[part]))]


def entry(piece: Piece, token: int, logprob: float) -> TopLogprob:
    raw = piece(token)
    return TopLogprob(id=token, text=raw.decode("utf-8", "replace"), bytes=raw, logprob=logprob)


def record(
    piece: Piece, token: int, logprob: float, top_ids: Sequence[int], top_logprobs: Sequence[float]
) -> TokenLogprob:
    """One sampled token's record: its own logprob and the alternatives, best first (tokens a grammar
    forbids, at -inf, are left out: they were never candidates)."""
    pairs = zip(top_ids, top_logprobs, strict=True)
    top = tuple(entry(piece, int(t), float(v)) for t, v in pairs if np.isfinite(v))
    return TokenLogprob(token=entry(piece, token, float(logprob)), top=top)
