"""The shared logit_bias / logprobs wire helpers: what a client may send, and the shapes sent back."""

from __future__ import annotations

import pytest

from kinfer.errors import InvalidRequest
from kinfer.protocol import TokenLogprob, TopLogprob
from kinfer.server.logprobs_wire import completion_columns, logit_bias, token_entries, top_count


def entry(token_id: int, text: str, logprob: float) -> TopLogprob:
    return TopLogprob(id=token_id, text=text, bytes=text.encode(), logprob=logprob)


RECORDS = [
    TokenLogprob(entry(1, "Hello", -0.1), (entry(1, "Hello", -0.1), entry(2, "Hi", -2.5))),
    TokenLogprob(entry(3, " wörld", -0.7), (entry(3, " wörld", -0.7), entry(4, " there", -0.9))),
]


def test_logit_bias_keys_are_token_ids_and_values_stay_within_100():
    assert logit_bias({"15": -100, "7": 2.5}) == ((15, -100.0), (7, 2.5))
    assert logit_bias(None) == ()
    for bad, fragment in [
        ({"x": 1}, "not a token id"),
        ({"1.5": 1}, "not a token id"),
        ({"-3": 1}, "negative"),
    ]:
        with pytest.raises(InvalidRequest, match=fragment):
            logit_bias(bad)
    with pytest.raises(InvalidRequest, match="between -100 and 100"):
        logit_bias({"1": 100.5})


def test_top_count_needs_the_switch_and_stays_within_20():
    assert top_count(None, None) is None and top_count(False, 0) is None
    assert top_count(True, None) == 0 and top_count(True, 20) == 20
    with pytest.raises(InvalidRequest, match="needs logprobs"):
        top_count(False, 3)
    with pytest.raises(InvalidRequest, match="between 0 and 20"):
        top_count(True, 21)


def test_entries_carry_token_text_bytes_and_alternatives():
    first, second = token_entries(RECORDS)
    assert first == {
        "token": "Hello",
        "logprob": -0.1,
        "bytes": list(b"Hello"),
        "top_logprobs": [
            {"token": "Hello", "logprob": -0.1, "bytes": list(b"Hello")},
            {"token": "Hi", "logprob": -2.5, "bytes": list(b"Hi")},
        ],
    }
    assert second["bytes"] == list(" wörld".encode())


def test_legacy_columns_count_text_offsets_in_characters_from_where_the_tokens_start():
    columns = completion_columns(RECORDS, offset=4)
    assert columns == {
        "tokens": ["Hello", " wörld"],
        "token_logprobs": [-0.1, -0.7],
        "top_logprobs": [{"Hello": -0.1, "Hi": -2.5}, {" wörld": -0.7, " there": -0.9}],
        "text_offset": [4, 9],
    }
