"""Constrained rows on the MLX engine (SmolLM2 in float32): the grammar's mask is added to the row's
logits on the device, inside the batched step, after the previous step is read back."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kinfer.chat.tool_formats import parse_call_body
from tests.constrain.schemas import PERSON, WEATHER_TOOL
from tests.engines.constrained import free_job, person_job, weather_call_job
from tests.engines.mlx.fixtures import *  # noqa: F403
from tests.engines.mlx.fixtures import run_alone, run_jobs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smollm_f32):
    from kinfer.engines.mlx.engine import MlxEngine

    engine = MlxEngine(smollm_f32.hf_dir, name="smollm2-f32", rows=3, ctx=1024)
    yield engine
    engine.close()


def test_constrained_and_free_rows_share_the_step(engine):
    alone = run_alone(engine, free_job(engine, "free", "Name three fruits.", max_tokens=24))
    together = run_jobs(
        engine,
        [
            person_job(engine, "json"),
            free_job(engine, "free", "Name three fruits.", max_tokens=24),
            weather_call_job(engine, "call"),
        ],
    )
    assert together["free"].text == alone.text  # the masks touch only their own rows
    jsonschema.validate(json.loads(together["json"].text), PERSON)
    assert together["json"].finish == "stop"
    reply = together["call"].text
    call = parse_call_body(reply.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    assert call is not None and call.name == "get_weather"
    jsonschema.validate(call.arguments, WEATHER_TOOL["parameters"])
