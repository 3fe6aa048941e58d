"""The llama.cpp model's vocabulary as llguidance reads it, for constrained rows (kinfer.constrain)."""

from __future__ import annotations

from kinfer.constrain.library import LLTokenizer
from kinfer.constrain.runtime import GrammarVocab
from kinfer.engines.llama import native


def grammar_vocab(vocab: native.Vocab) -> GrammarVocab:
    """A `GrammarVocab` over the GGUF's tokens; the tokenizer itself is built on first use.

    Only control tokens count as special: a user-defined token such as Qwen's `<tool_call>` spells its
    text, so a grammar's "<tool_call>" accepts it as well as the same text in smaller pieces."""

    def build() -> LLTokenizer:
        return LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
            tokens=vocab.grammar_pieces(),
            vocab_ptr=vocab.pointer,
            tokenize_fptr=native.tokenize_function(),
            eos_token=eog,
            slices=None,
        )

    eog = vocab.eog_tokens()
    return GrammarVocab(build, vocab.n_tokens, eog)
