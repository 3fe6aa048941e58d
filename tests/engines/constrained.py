"""Jobs with a constraint, built the way the engine thread builds them: the request rendered with the
model's template, its constraint compiled from the request (kinfer.constrain.build)."""

from __future__ import annotations

from kinfer.chat.template import render_prompt
from kinfer.constrain.build import build_constraint
from kinfer.engines.base import Engine, GenerationJob
from kinfer.protocol import ChatRequest, Message, ResponseFormat, ToolSpec
from tests.constrain.schemas import PERSON, PERSON_PROMPT, WEATHER_PROMPT, WEATHER_TOOL
from tests.engines.driver import job


def chat_job(engine: Engine, job_id: str, request: ChatRequest, max_tokens: int = 160, **kw) -> GenerationJob:
    info = engine.info
    rendered = render_prompt(info.chat_template, request, bos_token=info.bos_token, eos_token=info.eos_token)
    constraint = build_constraint(request, rendered)
    return job(job_id, engine.tokenize(rendered.text), max_tokens=max_tokens, constraint=constraint, **kw)


def person_job(engine: Engine, job_id: str, **kw) -> GenerationJob:
    request = ChatRequest(
        model="m",
        messages=(Message("user", PERSON_PROMPT),),
        response_format=ResponseFormat("json_schema", PERSON),
    )
    return chat_job(engine, job_id, request, **kw)


def free_job(engine: Engine, job_id: str, text: str, **kw) -> GenerationJob:
    return chat_job(engine, job_id, ChatRequest(model="m", messages=(Message("user", text),)), **kw)


def weather_call_job(engine: Engine, job_id: str, tool_choice: str = "required", **kw) -> GenerationJob:
    request = ChatRequest(
        model="m",
        messages=(Message("user", WEATHER_PROMPT),),
        tools=(ToolSpec(**WEATHER_TOOL),),
        tool_choice=tool_choice,
        parallel_tool_calls=False,
    )
    return chat_job(engine, job_id, request, **kw)
