"""Parse the body of one `<tool_call>...</tool_call>` block, in either format models write.

Hermes (Qwen2.5, Qwen3, NousResearch Hermes)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Qwen3.5 / Qwen3-Coder XML::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

XML values are text; they are JSON-decoded unless the tool's schema says the parameter is a string,
the rule Qwen3-Coder's own parser follows (mlx_lm/tool_parsers/qwen3_coder.py, vLLM's qwen3coder).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from kinfer.json_limits import too_deep
from kinfer.protocol import ToolCall, ToolSpec

_FUNCTION_RE = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)
_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}


def new_call_id() -> str:
    """An OpenAI-style call id: `call_` + 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


def parse_call_body(body: str, tools: tuple[ToolSpec, ...] = ()) -> ToolCall | None:
    """The call inside one `<tool_call>` block, or None when it is not a well-formed call.

    The body's own shape picks the format, so a model that mixes formats still gets its calls through.
    """
    stripped = body.strip()
    if stripped.startswith("{"):
        return parse_hermes(stripped)
    if stripped.startswith("<function="):
        return parse_xml(stripped, tools)
    return None


def parse_hermes(body: str) -> ToolCall | None:
    """`{"name": ..., "arguments": {...}}`; `arguments` may be a JSON string, or `parameters` (Llama)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or too_deep(data):  # a reply could not carry it (json.dumps recurses)
        return None
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return None
        if too_deep(arguments):
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return ToolCall(id=new_call_id(), name=name.strip(), arguments=arguments)


def parse_xml(body: str, tools: tuple[ToolSpec, ...] = ()) -> ToolCall | None:
    """`<function=NAME><parameter=KEY>VALUE</parameter>...</function>` with schema-aware values."""
    match = _FUNCTION_RE.search(body)
    if match is None or body[match.end() :].strip():
        return None
    name = match.group(1).strip()
    if not name:
        return None
    properties = _properties(name, tools)
    arguments: dict[str, Any] = {}
    for key, raw in _PARAMETER_RE.findall(match.group(2)):
        key = key.strip()
        if not key:
            return None
        # the template writes "<parameter=k>\nVALUE\n</parameter>": one newline each side is framing
        value = raw[1:] if raw.startswith("\n") else raw
        value = value[:-1] if value.endswith("\n") else value
        arguments[key] = convert_value(value, properties.get(key))
    return ToolCall(id=new_call_id(), name=name, arguments=arguments)


def convert_value(value: str, schema: Any) -> Any:
    """A parameter's text as the tool expects it: the raw string for string parameters, else JSON."""
    types = _schema_types(schema)
    if types & _STRING_TYPES:
        if value.strip().lower() == "null" and "null" in types:
            return None
        return value
    try:
        decoded = json.loads(value)
    except (json.JSONDecodeError, ValueError, RecursionError):
        pass
    else:
        return value if too_deep(decoded) else decoded
    # Python spellings models fall back to for booleans and null
    lowered = value.strip().lower()
    if lowered in ("true", "false") and types & {"boolean", "bool"}:
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    return value


def _properties(name: str, tools: tuple[ToolSpec, ...]) -> dict[str, Any]:
    for tool in tools:
        if tool.name == name:
            properties = tool.parameters.get("properties")
            return properties if isinstance(properties, dict) else {}
    return {}


def _schema_types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared.strip().lower()}
    if isinstance(declared, list):
        return {str(t).strip().lower() for t in declared}
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return {"string"}
    return set()
