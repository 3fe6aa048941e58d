"""Shared pieces of the HTTP edge: a lenient pydantic base model, body parsing, OpenAI's error envelope."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from quart import request

from kinfer.errors import InvalidRequest, KinferError, PromptTooLong
from kinfer.json_limits import MAX_JSON_DEPTH, too_deep

log = logging.getLogger(__name__)

W = TypeVar("W", bound="WireModel")

# a \uD800-\uDFFF escape: JSON allows a lone one, but no tokenizer can encode the string it makes
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")

# OpenAI's error envelope, which both OpenAI dialects (Chat Completions and Responses) answer in
OPENAI_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


class WireModel(BaseModel):
    """Accepts fields we do not know (clients send many) and logs them once per request."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    @model_validator(mode="after")
    def _log_unknown(self) -> WireModel:
        if self.model_extra:
            log.debug("%s: ignoring unknown fields %s", type(self).__name__, sorted(self.model_extra))
        return self


class FunctionDef(WireModel):
    """A function tool's definition; OpenAI and Ollama spell it the same way."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


# (dialect, tool type) pairs already warned about: an agent sends the same hosted tools every turn
_dropped_tools_warned: set[tuple[str, str]] = set()


def warn_dropped_tool(dialect: str, kind: str) -> None:
    """Say once per dialect and tool type, not once per request, that a tool kinfer cannot run is dropped."""
    if (dialect, kind) in _dropped_tools_warned:
        return
    _dropped_tools_warned.add((dialect, kind))
    log.warning(
        "%s: dropping %r tools: kinfer runs client function tools only (logged once; later ones are "
        "dropped silently)",
        dialect,
        kind,
    )


def tool_choice_mode(choice: str) -> str:
    """A tool_choice given as a string (both OpenAI dialects): 'auto', 'none' or 'required'."""
    if choice not in ("auto", "none", "required"):
        raise InvalidRequest("tool_choice must be 'auto', 'none', 'required' or a function")
    return choice


def openai_type(error: KinferError) -> str:
    """The error's `type` in both OpenAI dialects: an unknown model or route is an
    `invalid_request_error` there (with a 404), where Anthropic says `not_found_error`."""
    return "invalid_request_error" if error.kind == "not_found_error" else error.kind


def context_length_message(error: PromptTooLong, what: str) -> str:
    """OpenAI's own wording (GPT-5's: the one LangChain and LiteLLM recognise), and why the limit is."""
    why = f" ({error.why})" if error.why else ""
    return (
        f"Input tokens exceed the configured limit of {error.limit} tokens. Your {what} resulted in "
        f"{error.prompt_tokens} tokens. Please reduce the length of the {what}.{why}"
    )


def describe_validation_error(exc: ValidationError) -> str:
    """One readable line per problem: `messages.0.role: Input should be ...`."""
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error.get("loc", ())) or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)


def parse_wire(model: type[W], data: Any) -> W:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid request: {describe_validation_error(exc)}") from None


async def read_body(model: type[W]) -> W:
    """The request's JSON body as `model`; malformed JSON or wrong types are a 400."""
    raw = await request.get_data(as_text=False)
    if not raw or not raw.strip():
        raise InvalidRequest("the request body is empty; send a JSON object")
    data = parse_json(raw)
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        return parse_wire(model, data)
    except RecursionError:
        raise InvalidRequest("the request body is nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise InvalidRequest(f"the request body is not valid JSON: {name} is not a JSON number")


def parse_json(raw: bytes) -> Any:
    """Strict JSON: no NaN/Infinity, no lone surrogates; every way it can fail is a 400, never a 500."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise InvalidRequest("the request body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise InvalidRequest("the request body is nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.int_info)
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    check_nesting(data)
    if _SURROGATE_ESCAPE.search(raw) and not _encodable(data):
        raise InvalidRequest("the request body holds a lone UTF-16 surrogate (\\ud800-\\udfff escape)")
    return data


def check_nesting(data: Any, what: str = "the request body") -> None:
    """Refuse JSON nested deeper than any real request (a tool schema 900 levels deep was a 500)."""
    if too_deep(data):
        raise InvalidRequest(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")


def loads_arguments(text: str, what: str) -> Any:
    """Tool-call arguments sent as a JSON string (OpenAI's dialects); `ValueError` when not JSON."""
    try:
        value = json.loads(text or "{}")
    except RecursionError:
        raise InvalidRequest(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep") from None
    check_nesting(value, what)
    return value


def _encodable(data: Any) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except RecursionError:
        raise InvalidRequest("the request body is nested too deeply") from None
    return True


def json_dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
