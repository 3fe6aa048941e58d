"""The MLX model's vocabulary as llguidance reads it, for constrained rows (kinfer.constrain)."""

from __future__ import annotations

from collections.abc import Iterable

from kinfer.constrain.library import LLTokenizer, TokenizerWrapper
from kinfer.constrain.runtime import GrammarVocab
from kinfer.engines.mlx.tokenizer import MlxTokenizer


class _Vocabulary:
    """What llguidance's `TokenizerWrapper` reads: each token's bytes, the special ones, a tokenizer."""

    def __init__(self, tokenizer: MlxTokenizer, n_vocab: int, eos: list[int]) -> None:
        self.tokens = [tokenizer.piece(i) for i in range(n_vocab)]
        self.special_token_ids = tokenizer.special_ids()
        self.eos_token_id = eos[0] if eos else None
        self.bos_token_id = tokenizer.bos_id
        self._tokenizer = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode_plain(text)


def grammar_vocab(tokenizer: MlxTokenizer, n_vocab: int, eos: Iterable[int]) -> GrammarVocab:
    """A `GrammarVocab` over the model's `n_vocab` tokens (the embedding's rows, which may outnumber the
    tokenizer's). Only added tokens marked special count as special: Qwen's `<tool_call>` is not, so a
    grammar's "<tool_call>" accepts that token as well as the same text in smaller pieces.
    (`LLTokenizer(path)` would treat every added token as special.)"""
    eos = sorted(set(eos))

    def build() -> LLTokenizer:
        return LLTokenizer(TokenizerWrapper(_Vocabulary(tokenizer, n_vocab, eos)), eos_token=eos)

    return GrammarVocab(build, n_vocab, eos)
