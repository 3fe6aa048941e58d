"""A row's grammar state (when it starts, when it ends, how it fails) and the masks the engines apply."""

from __future__ import annotations

import numpy as np
import pytest

from kinfer.constrain.grammars import json_rule, tool_call_rules
from kinfer.constrain.runtime import MaskTable, RowGrammar
from kinfer.constrain.spec import Constraint
from kinfer.errors import InvalidRequest
from kinfer.protocol import ToolSpec
from tests.constrain.conftest import BYTE, EOS, byte_tokens, make_vocab, merged, piece_of

UNIT = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"]}
JSON = "start: answer\nanswer: " + json_rule(UNIT)
CALLS = "start: calls\n" + tool_call_rules([ToolSpec("set_unit", "", UNIT)], "hermes", parallel=False)


def write(grammar: RowGrammar, text: str) -> None:
    for token in byte_tokens(text):
        grammar.accept(token, piece_of(token))


def test_a_grammar_without_markers_decides_from_the_first_token(vocab):
    grammar = vocab.start(Constraint(JSON, "json"))
    assert grammar.active and not grammar.ended
    write(grammar, '{"unit": "c"')
    assert not grammar.ended
    write(grammar, "}")
    assert grammar.ended and grammar.error is None  # complete: the reply ends here


def test_thinking_stays_free_and_the_answer_starts_after_the_closer(vocab):
    grammar = vocab.start(Constraint(JSON, "json", start_after="</think>"))
    write(grammar, "Let me think about {units} </thi")
    assert not grammar.active and grammar.blocks_eos  # a forced answer: the reply may not end in thought
    # one token closes the block, skips the template's blank line and opens the object
    token = merged(b"</think>\n\n{")
    grammar.accept(token, piece_of(token))
    assert grammar.active and not grammar.blocks_eos
    write(grammar, '"unit": "f"}')
    assert grammar.ended and grammar.error is None


def test_a_lazy_grammar_waits_for_its_trigger_and_checks_the_call(vocab):
    grammar = vocab.start(Constraint(CALLS, "tool_call", trigger="<tool_call>"))
    write(grammar, "Sure, I can set it")
    assert not grammar.active and not grammar.blocks_eos  # free text, which may simply end
    token = merged(b'.<tool_call>\n{"')  # the opener starts inside a token: the grammar takes it from there
    grammar.accept(token, piece_of(token))
    assert grammar.active
    write(grammar, 'name": "set_unit", "arguments": {"unit": "c"}}')
    token = merged(b"\n</tool_call>")
    grammar.accept(token, piece_of(token))
    assert grammar.ended and grammar.error is None


def test_a_reply_that_leaves_its_grammar_ends_with_an_error(vocab):
    grammar = vocab.start(Constraint(CALLS, "tool_call", trigger="<tool_call>"))
    token = merged(b"<tool_call>")
    grammar.accept(token, piece_of(token))
    write(grammar, "\n{oops")
    assert grammar.ended and "left its grammar" in (grammar.error or "")


def test_masks_allow_what_the_grammar_allows_and_nothing_else(vocab):
    masks = MaskTable(4, vocab)
    answer = vocab.start(Constraint(JSON, "json"))
    thinking = vocab.start(Constraint(JSON, "json", start_after="</think>"))
    write(answer, '{"unit": "')
    masks.fill([(1, answer), (3, thinking)])
    allowed = masks.allowed(1, vocab.n_vocab)
    assert {t for t in np.flatnonzero(allowed)} == {BYTE + ord("c"), BYTE + ord("f")}
    free = masks.allowed(3, vocab.n_vocab)
    assert free.sum() == vocab.n_vocab - 1 and not free[EOS]  # anything but the end of the reply
    assert masks.filled == 1 and masks.seconds > 0


def test_a_complete_grammar_allows_the_end_and_a_broken_one_nothing(vocab):
    masks = MaskTable(2, vocab)
    done = vocab.start(Constraint(CALLS, "tool_call", trigger="<tool_call>"))
    token = merged(b"<tool_call>")
    done.accept(token, piece_of(token))
    write(done, '\n{"name": "set_unit", "arguments": {"unit": "c"}}\n</tool_call')
    masks.fill([(0, done)])
    assert np.flatnonzero(masks.allowed(0, vocab.n_vocab)).tolist() == [BYTE + ord(">")]
    broken = vocab.start(Constraint(JSON, "json"))
    broken.matcher.consume_token(BYTE + ord("x"))  # behind the engine's back: the matcher is in error
    masks.fill([(1, broken)])
    assert masks.dead_end(1, broken) and "left its grammar" in (broken.error or "")
    stuck = vocab.start(Constraint(JSON, "json"))
    masks.words[0] = 0  # as if no token of the model's vocabulary could go on
    assert masks.dead_end(0, stuck) and stuck.error == "the grammar allows no next token"


def test_compiled_grammars_are_cached_and_each_row_gets_its_own_state():
    vocab = make_vocab()
    first, second = vocab.start(Constraint(JSON, "json")), vocab.start(Constraint(JSON, "json"))
    assert len(vocab._compiled) == 1
    write(first, '{"unit": "c"}')
    assert first.ended and not second.ended


def test_a_lazy_grammar_skips_a_think_block_the_model_opens_itself(vocab):
    grammar = vocab.start(
        Constraint(CALLS, "tool_call", trigger="<tool_call>", think=("<think>", "</think>"))
    )
    write(grammar, "\n<think>I could write <tool_call> here: it is only a thought.</think>\n")
    assert not grammar.active  # the opener inside the thought did not start the grammar
    write(grammar, '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "f"}}\n</tool_call>')
    assert grammar.ended and grammar.error is None
    plain = vocab.start(Constraint(CALLS, "tool_call", trigger="<tool_call>", think=("<think>", "</think>")))
    write(plain, "No thinking: <tool_call>")  # a reply that does not open the block is scanned at once
    assert plain.active


def test_a_lazy_grammar_that_does_not_compile_leaves_the_row_free_and_a_forced_one_refuses(vocab):
    broken = "start: calls\ncalls: <[99999999]>"
    assert vocab.start(Constraint(broken, "tool_call", trigger="<tool_call>")) is None
    with pytest.raises(InvalidRequest, match="could not be compiled"):
        vocab.start(Constraint(broken, "tool_call"))


def test_an_unpacked_table_lays_out_the_forbidden_tokens_for_host_side_masking(vocab):
    masks = MaskTable(1, vocab, unpack=True)
    grammar = vocab.start(Constraint(JSON, "json"))
    write(grammar, '{"unit": "')
    masks.fill([(0, grammar)])
    assert set(np.flatnonzero(~masks.forbidden(0))) == {BYTE + ord("c"), BYTE + ord("f")}


def test_a_sparse_mask_draws_greedily_among_its_few_tokens_and_a_dense_one_leaves_it_to_the_engine(vocab):
    masks = MaskTable(2, vocab, unpack=True, sparse_words=4)  # this vocabulary has 9 words
    answer = vocab.start(Constraint(JSON, "json"))
    write(answer, '{"unit": "')
    thinking = vocab.start(Constraint(JSON, "json", start_after="</think>"))  # anything but the end
    masks.fill([(0, answer), (1, thinking)])
    logits = np.zeros(vocab.n_vocab, dtype=np.float32)
    logits[BYTE + ord("x")] = 9.0  # the best token overall is not allowed
    logits[BYTE + ord("c")] = logits[BYTE + ord("f")] = 2.0  # a tie: the first one wins, as argmax
    assert masks.best_allowed(0, logits) == BYTE + ord("c")
    assert masks.best_allowed(1, logits) is None  # dense: the engine checks its own best token first
    # the sparse row's booleans are laid out only when asked, and say the same
    assert set(np.flatnonzero(~masks.forbidden(0))) == {BYTE + ord("c"), BYTE + ord("f")}
    assert np.flatnonzero(masks.forbidden(1)).tolist() == [EOS]
