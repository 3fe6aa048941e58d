"""A byte-level vocabulary for grammar tests without a model: token 0 ends the reply, token 1 + b is the
byte b, and a few longer tokens (as real vocabularies have) let one token cross a marker."""

from __future__ import annotations

import pytest
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

from kinfer.constrain.runtime import GrammarVocab

EOS = 0
BYTE = 1  # token of byte b: BYTE + b
MERGED = [b"<tool_call>", b"</think>\n\n{", b'.<tool_call>\n{"', b"\n</tool_call>"]


class _ByteVocabulary:
    eos_token_id = EOS
    bos_token_id = None
    special_token_ids = (EOS,)

    def __init__(self) -> None:
        self.tokens = [b"<eos>", *(bytes([b]) for b in range(256)), *MERGED]

    def __call__(self, data: bytes | str) -> list[int]:
        if isinstance(data, str):
            data = data.encode()
        return byte_tokens(data)


def byte_tokens(data: bytes | str) -> list[int]:
    """One token per byte."""
    if isinstance(data, str):
        data = data.encode()
    return [BYTE + b for b in data]


def merged(piece: bytes) -> int:
    """The token of one of the longer pieces."""
    return BYTE + 256 + MERGED.index(piece)


def piece_of(token: int) -> bytes:
    return _ByteVocabulary().tokens[token] if token else b""


def make_vocab() -> GrammarVocab:
    vocabulary = _ByteVocabulary()
    return GrammarVocab(
        lambda: LLTokenizer(TokenizerWrapper(vocabulary), eos_token=EOS), len(vocabulary.tokens), [EOS]
    )


@pytest.fixture(scope="session")
def vocab() -> GrammarVocab:
    return make_vocab()


def accepts(vocab: GrammarVocab, grammar: str, text: str) -> bool:
    """Whether `grammar` takes the whole of `text` and is then complete."""
    matcher = LLMatcher(vocab.tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(byte_tokens(text)) and matcher.is_accepting()
