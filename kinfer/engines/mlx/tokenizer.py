"""The tokenizer of a Hugging Face model directory, read with `tokenizers` (no transformers import).

Encoding parses special tokens and adds BOS only when the tokenizer would add one and the text does not
already start with it (a rendered chat template often writes BOS itself). Streaming uses a table of each
token's raw bytes, so the engine turns a sampled token into text with one list lookup plus a UTF-8
joiner; a character split across tokens comes out whole.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from kinfer.errors import EngineFailure

log = logging.getLogger(__name__)


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character map, which ByteLevel BPE vocabularies are written in."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(visible)
    extra = 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(visible, (chr(c) for c in chars), strict=True))


def _decoder_kinds(spec: dict | None) -> set[str]:
    if not spec:
        return set()
    if spec.get("type") == "Sequence":
        kinds: set[str] = set()
        for part in spec.get("decoders", []):
            kinds |= _decoder_kinds(part)
        return kinds
    kind = spec.get("type", "")
    if kind == "Replace" and spec.get("pattern", {}).get("String") == "▁":
        return {"Metaspace"}
    return {kind}


class MlxTokenizer:
    """tokenizer.json + tokenizer_config.json of one model directory."""

    def __init__(self, path: Path, *, vocab_size: int = 0) -> None:
        from tokenizers import Tokenizer

        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise EngineFailure(f"{path} has no tokenizer.json (kinfer reads only fast tokenizers)")
        self._tok = Tokenizer.from_file(str(tokenizer_file))
        config_file = path / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.is_file() else {}

        self.bos_token = _token_text(self.config.get("bos_token")) or ""
        self.eos_token = _token_text(self.config.get("eos_token")) or ""
        self.bos_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.adds_bos = self._detect_adds_bos()
        self.vocab_size = max(vocab_size, self._tok.get_vocab_size(with_added_tokens=True))
        self._pieces = self._piece_table(json.loads(tokenizer_file.read_text()).get("decoder"))

    # ---- encoding / decoding ------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL (encode does not): prompts are tokenized on preparation
        # threads, and the engine thread's step must not wait on a long one
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        if self.adds_bos and self.bos_id is not None and not text.startswith(self.bos_token):
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, tokens: list[int]) -> str:
        return self._tok.decode(list(tokens), skip_special_tokens=False)

    def piece(self, token: int) -> bytes:
        """The raw bytes token `token` stands for (special tokens as their text)."""
        pieces = self._pieces
        return pieces[token] if 0 <= token < len(pieces) else b""

    def token_id(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` alone (no BOS)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def special_ids(self) -> list[int]:
        """Added tokens marked special (control tokens that never spell text in a reply)."""
        return sorted(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    # ---- setup --------------------------------------------------------------------------

    def _detect_adds_bos(self) -> bool:
        if self.bos_id is None:
            return False
        flag = self.config.get("add_bos_token")
        if isinstance(flag, bool) and flag:
            return True
        # Llama 3 style: the post-processor adds BOS (tokenizer_config may not say so)
        probe = self._tok.encode("a", add_special_tokens=True).ids
        return bool(probe) and probe[0] == self.bos_id

    def _piece_table(self, decoder: dict | None) -> list[bytes]:
        kinds = _decoder_kinds(decoder)
        added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        table: list[bytes] = []
        for token_id in range(self.vocab_size):
            if token_id in added:
                table.append(added[token_id].encode())
                continue
            text = self._tok.id_to_token(token_id)
            if text is None:
                table.append(b"")
            elif "ByteLevel" in kinds:
                table.append(bytes(byte_of.get(c, 0x3F) for c in text))
            elif "Metaspace" in kinds or "ByteFallback" in kinds:
                if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                    table.append(bytes([int(text[3:5], 16)]))
                else:
                    table.append(text.replace("▁", " ").encode())
            else:
                # WordPiece and friends: decoding one token alone is the best we can do
                table.append(self._tok.decode([token_id], skip_special_tokens=False).encode())
        if "ByteLevel" not in kinds and not ({"Metaspace", "ByteFallback"} & kinds):
            log.info("tokenizer decoder %s: streaming pieces decoded one token at a time", kinds or "none")
        return table
