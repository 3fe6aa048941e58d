"""Prompt text of about N tokens, sized from a server's own usage numbers."""

from __future__ import annotations

import pytest

from kinfer.bench.prompts import PromptSizer, filler, fit_sizer, prompt_text


def test_filler_is_seeded_and_every_seed_gives_other_text():
    assert filler(50, seed=7) == filler(50, seed=7)
    assert filler(50, seed=7) != filler(50, seed=8)
    assert len(filler(50, seed=7).split()) == 50


def test_prompts_of_different_seeds_differ_from_the_first_word_on():
    a, b = prompt_text(20, 1000), prompt_text(20, 1001)
    assert a.split()[:2] != b.split()[:2]


def test_the_sizer_fits_a_line_through_usage_samples():
    # a server that counts 30 template tokens and 1.25 tokens per word
    samples = [(8, 40), (400, 530)]
    sizer = fit_sizer(samples)
    assert sizer.calibrated
    assert sizer.tokens_per_word == pytest.approx(1.25)
    assert sizer.overhead == pytest.approx(30)
    assert sizer.words_for(530) == 400
    assert sizer.estimate(400) == 530


def test_the_sizer_refuses_samples_it_cannot_fit():
    with pytest.raises(ValueError):
        fit_sizer([(10, 40)])
    with pytest.raises(ValueError):
        fit_sizer([(10, 40), (10, 41)])
    with pytest.raises(ValueError):
        fit_sizer([(10, 40), (20, 30)])  # fewer tokens for more text: not a tokenizer


def test_the_default_sizer_never_asks_for_less_than_one_word():
    assert PromptSizer().words_for(1) == 1
