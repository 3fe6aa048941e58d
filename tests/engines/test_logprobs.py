"""What both engines share about logit_bias and logprob records."""

from __future__ import annotations

import numpy as np
import pytest

from kinfer.engines.logprobs import bias_arrays, check_bias_ids, record, top_indices
from kinfer.errors import InvalidRequest
from kinfer.protocol import Sampling

PIECES = {0: b"a", 1: b"b", 2: b"\xe2\x82", 3: b"d"}


def test_top_indices_are_best_first_with_ties_broken_by_the_lower_id():
    values = np.array([0.5, 2.0, 2.0, -1.0], dtype=np.float32)
    assert top_indices(values, 3).tolist() == [1, 2, 0]
    assert top_indices(values, 0).tolist() == []


def test_a_record_leaves_out_tokens_a_grammar_forbade_and_decodes_partial_characters_leniently():
    made = record(PIECES.__getitem__, 2, -0.25, [2, 0, 3], [-0.25, -1.5, float("-inf")])
    assert made.token.id == 2 and made.token.bytes == b"\xe2\x82" and made.token.text == "\ufffd"
    assert [t.id for t in made.top] == [2, 0]  # token 3 was masked: never a candidate


def test_a_bias_names_each_token_once_and_ids_must_be_in_the_vocabulary():
    ids, values = bias_arrays(Sampling(logit_bias=((5, 1.0), (7, -100.0), (5, 3.0))))
    assert dict(zip(ids.tolist(), values.tolist(), strict=True)) == {5: 3.0, 7: -100.0}
    assert bias_arrays(Sampling()) is None
    check_bias_ids(Sampling(logit_bias=((9, 1.0),)), vocab=10)
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        check_bias_ids(Sampling(logit_bias=((10, 1.0),)), vocab=10)
