"""logit_bias and logprobs on the wire, shared by the dialects that have them (no dialect imports
another; each imports this). OpenAI Chat, Responses and Ollama (>= 0.12) write a token's logprob the
same way: `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`; legacy Completions has
its own columns (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kinfer.errors import InvalidRequest
from kinfer.protocol import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, TokenLogprob, TopLogprob


def logit_bias(wire: Mapping[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias` (token id as a string -> bias in [-100, 100]) as (id, bias) pairs."""
    pairs = []
    for key, value in (wire or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequest(f"logit_bias: {key!r} is not a token id (an integer)") from None
        if token < 0:
            raise InvalidRequest(f"logit_bias: token id {token} is negative")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise InvalidRequest(f"logit_bias: the bias of token {token} must be between -100 and 100")
        pairs.append((token, float(value)))
    return tuple(pairs)


def top_count(wanted: bool | None, top: int | None, *, top_name: str = "top_logprobs") -> int | None:
    """How many alternatives to report per token (None: no logprobs), from a logprobs switch and a
    top count; a top count without the switch is refused, as OpenAI does."""
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{top_name} must be between 0 and {MAX_TOP_LOGPROBS}")
    if not wanted:
        if top:
            raise InvalidRequest(f"{top_name} needs logprobs to be true")
        return None
    return top or 0


def _entry(entry: TopLogprob) -> dict[str, Any]:
    return {"token": entry.text, "logprob": entry.logprob, "bytes": list(entry.bytes)}


def token_entries(records: Iterable[TokenLogprob]) -> list[dict[str, Any]]:
    """OpenAI Chat's `logprobs.content`, Responses' `output_text.logprobs`, Ollama's `logprobs`."""
    return [{**_entry(r.token), "top_logprobs": [_entry(t) for t in r.top]} for r in records]


def completion_columns(records: Iterable[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """Legacy Completions' `logprobs`: one column per field; `text_offset` counts characters from the
    start of the choice's text (`offset`: where these tokens begin)."""
    tokens, values, tops, offsets = [], [], [], []
    for r in records:
        tokens.append(r.token.text)
        values.append(r.token.logprob)
        tops.append({t.text: t.logprob for t in r.top})
        offsets.append(offset)
        offset += len(r.token.text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
