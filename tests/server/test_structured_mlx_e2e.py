"""Structured output on the MLX engine end to end: the real server with SmolLM2 in float32 on MLX, every
dialect. MLX runs slowly on a CPU, so by default one reply per dialect; KINFER_STRUCTURED_REPLIES_MLX
sets more (the acceptance run used 10)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from tests.constrain.schemas import PERSON
from tests.server.structured_helpers import ANSWER, CALL, CALL_FINISH

pytestmark = pytest.mark.slow

REPLIES = int(os.environ.get("KINFER_STRUCTURED_REPLIES_MLX", "1"))


def test_every_dialect_gets_json_valid_against_the_schema(mlx_server):
    asks = [(dialect, seed) for dialect in ANSWER for seed in range(REPLIES)]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda ask: (ask[0], ANSWER[ask[0]](mlx_server.url, PERSON, ask[1])), asks))
    for _dialect, reply in replies:
        jsonschema.validate(json.loads(reply), PERSON)


def test_a_forced_call_streams_with_valid_arguments(mlx_server):
    made = CALL["openai"](mlx_server.url, False, True)
    assert made.finish == CALL_FINISH["openai"] and [name for name, _ in made.calls] == ["get_weather"]
