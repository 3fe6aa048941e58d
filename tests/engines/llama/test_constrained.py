"""Constrained rows on the llama.cpp engine with the bundled SmolLM2, which cannot write valid JSON
unaided: the grammar's mask goes on llama.cpp's own logits, row by row, inside the batched step."""

from __future__ import annotations

import json

import jsonschema

from kinfer.chat.tool_formats import parse_call_body
from kinfer.protocol import Sampling
from tests.constrain.schemas import PERSON, WEATHER_TOOL
from tests.engines.constrained import free_job, person_job, weather_call_job
from tests.engines.llama.fixtures import *  # noqa: F403
from tests.engines.llama.fixtures import run_alone, run_jobs

SAMPLED = Sampling(temperature=0.8, seed=11)


def test_a_constrained_reply_is_valid_json_and_ends_with_its_grammar(make_engine):
    engine = make_engine(ctx=2048)
    unaided = run_alone(engine, free_job(engine, "free", "Invent a person and describe them as JSON."))
    replies = run_jobs(
        engine, [person_job(engine, "greedy"), person_job(engine, "sampled", sampling=SAMPLED)]
    )
    for reply in replies.values():
        jsonschema.validate(json.loads(reply.text), PERSON)
        assert reply.finish == "stop"  # the object closed: nothing more was asked of the model
    try:
        jsonschema.validate(json.loads(unaided.text), PERSON)
    except (ValueError, jsonschema.ValidationError):
        pass  # as expected: unaided, the model writes prose
    else:
        raise AssertionError("SmolLM2 wrote valid JSON unaided; this test no longer shows the grammar's work")


def test_free_rows_beside_constrained_ones_write_what_they_write_alone(make_engine):
    engine = make_engine(ctx=2048)
    prompts = {"a": "Name three fruits.", "b": "What is the capital of France?"}
    alone = {
        key: run_alone(engine, free_job(engine, key, text, max_tokens=40)).text
        for key, text in prompts.items()
    }
    jobs = [
        person_job(engine, "json"),
        free_job(engine, "a", prompts["a"], max_tokens=40),
        weather_call_job(engine, "call"),
        free_job(engine, "b", prompts["b"], max_tokens=40),
    ]
    together = run_jobs(engine, jobs)
    assert {key: together[key].text for key in prompts} == alone
    jsonschema.validate(json.loads(together["json"].text), PERSON)


def test_a_forced_call_is_the_models_own_format_with_valid_arguments(make_engine):
    engine = make_engine()
    for choice in ("required", "get_weather"):
        reply = run_alone(engine, weather_call_job(engine, choice))
        assert reply.finish == "stop"
        assert reply.text.startswith("<tool_call>\n") and reply.text.endswith("\n</tool_call>")
        call = parse_call_body(reply.text[len("<tool_call>") : -len("</tool_call>")])
        assert call is not None and call.name == "get_weather"
        jsonschema.validate(call.arguments, WEATHER_TOOL["parameters"])


def test_a_grammar_that_cannot_go_on_ends_its_row_with_an_error_and_the_others_carry_on(make_engine):
    engine = make_engine()
    engine.submit(person_job(engine, "stuck"))
    engine.submit(free_job(engine, "free", "Name three fruits.", max_tokens=8))
    # the grammar's state breaks behind the engine's back, as a vocabulary the grammar cannot use would
    engine._rows["stuck", 0].grammar.matcher.consume_token(engine.tokenize("x")[0])
    results = run_jobs(engine, [])
    stuck = results["stuck"]
    assert stuck.finish == "error" and "grammar" in stuck.updates[-1].error
    assert results["free"].finish == "length" and results["free"].new_tokens == 8
