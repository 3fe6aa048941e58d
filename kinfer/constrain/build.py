"""Which constraint a request gets, decided once its prompt is rendered (the template says how the model
writes tool calls and whether the reply starts inside a think block).

- a forced tool call (`tool_choice` "required", or a function's name: one call of it): the reply is
  that call (or, "required" with parallel calls allowed, calls one per line), in the model's own
  format, its arguments valid against the tool's schema;
- `response_format`: the answer is JSON (valid against the schema); with tools on "auto" the model
  may call a tool instead;
- tools on "auto" alone: the reply is free, but a call the model starts must be well formed (a lazy
  grammar, triggered by the tool-call opener).

Thinking stays free: when the prompt opens a think block, the constraint starts after its closer.
"""

from __future__ import annotations

import logging

from kinfer.chat.template import RenderedPrompt
from kinfer.chat.traits import TOOL_CALL_OPEN, ToolFormat
from kinfer.constrain.grammars import (
    ANY_OBJECT,
    SchemaError,
    check_schema,
    grammar_error,
    json_rule,
    tool_call_rules,
)
from kinfer.constrain.spec import Constraint
from kinfer.errors import InvalidRequest
from kinfer.protocol import ChatRequest, ResponseFormat

log = logging.getLogger(__name__)


def build_constraint(request: ChatRequest, rendered: RenderedPrompt) -> Constraint | None:
    """The grammar `request`'s reply must follow, or None. Raises `InvalidRequest` for a schema the
    grammar engine cannot enforce (naming the keyword it refused)."""
    try:
        return _build(request, rendered)
    except RecursionError:
        raise InvalidRequest("a JSON schema in the request is nested too deeply to enforce") from None


def _build(request: ChatRequest, rendered: RenderedPrompt) -> Constraint | None:
    traits = rendered.traits
    start_after = traits.think_close if rendered.starts_in_thinking else None
    choice = request.tool_choice
    try:
        if request.tools and choice not in ("auto", "none"):
            if choice == "required":
                tools, parallel = request.tools, request.parallel_tool_calls
            else:  # a named function is called once, as OpenAI and vLLM do
                tools, parallel = tuple(t for t in request.tools if t.name == choice), False
            calls = tool_call_rules(tools, traits.tool_format, parallel=parallel)
            return _checked(Constraint("start: calls\n" + calls, "tool_call", start_after))
        answer = _answer_rule(request.response_format) if request.response_format else None
    except SchemaError as exc:
        raise InvalidRequest(str(exc)) from None
    calls = _lenient_calls(request, traits.tool_format) if request.tools and choice == "auto" else None
    if answer is not None and calls is not None:
        return _checked(
            Constraint(f"start: answer | calls\n{answer}\n{calls}", "json_or_tool_call", start_after)
        )
    if answer is not None:
        return _checked(Constraint(f"start: answer\n{answer}", "json", start_after))
    if calls is not None:
        # only a call the model starts is checked: a grammar that does not compile is no reason to refuse
        lazy = Constraint(
            "start: calls\n" + calls, "tool_call", start_after, TOOL_CALL_OPEN, _own_think(rendered)
        )
        error = grammar_error(lazy.grammar)
        if error:
            log.warning("tool calls left unconstrained: %s", error)
            return None
        return lazy
    return None


def _answer_rule(fmt: ResponseFormat) -> str:
    if fmt.kind == "json_object":
        return "answer: " + json_rule(ANY_OBJECT)
    check_schema(fmt.schema, "the response format's JSON schema")
    assert fmt.schema is not None
    return "answer: " + json_rule(fmt.schema)


def _lenient_calls(request: ChatRequest, tool_format: ToolFormat) -> str | None:
    """Calls of any offered tool, for a model that may call one: keywords the engine does not implement
    loosen the grammar rather than refuse a request that may never call a tool at all."""
    try:
        return tool_call_rules(request.tools, tool_format, parallel=request.parallel_tool_calls, lenient=True)
    except SchemaError as exc:
        log.info("tool calls left unconstrained: %s", exc)
        return None


def _own_think(rendered: RenderedPrompt) -> tuple[str, str] | None:
    """The think markers, when the model may open a think block the prompt did not open."""
    traits = rendered.traits
    if not traits.supports_thinking or rendered.starts_in_thinking:
        return None
    return traits.think_open, traits.think_close


def _checked(constraint: Constraint) -> Constraint:
    error = grammar_error(constraint.grammar)
    if error:  # kinfer built a grammar llguidance refuses: say so rather than generate unconstrained
        raise InvalidRequest(f"the output constraint could not be compiled: {error}")
    return constraint
