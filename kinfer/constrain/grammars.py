"""JSON Schema and the tool-call formats models write, as grammars in llguidance's Lark syntax.

JSON is laid out one way only (", " and ": ", no other whitespace): a small model given the freedom
of JSON's whitespace can spend its whole reply on newlines. Tool calls follow the model's own format
(kinfer/chat/tool_formats.py), byte for byte as its template writes them:

    Hermes:  <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>
    XML:     <tool_call>\\n<function=f>\\n<parameter=k>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

XML values are raw text for string parameters (anything up to the closing tag) and JSON otherwise,
the rule the parser applies when it reads them back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from kinfer.chat.traits import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolFormat
from kinfer.constrain.library import LLMatcher
from kinfer.protocol import ToolSpec

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
_XML_TEXT_RULE = "xml_text[lazy]: /(?s:.*)\\n<\\/parameter>\\n/"
_STRING_TYPES = {"string"}
_LOCATION = re.compile(r"^at \d+\(\d+\): ")
_SOURCE_LINE = re.compile(r"^\s+\d+ \| ")
# where a schema holds schemas: as values of a map, or as a schema (or list of them)
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "not", "contains")


class SchemaError(ValueError):
    """A JSON schema the grammar engine cannot enforce; the message names what it refused."""


def literal(text: str) -> str:
    """`text` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def json_rule(schema: dict[str, Any], *, lenient: bool = False) -> str:
    """`%json {...}`: JSON valid against `schema`, in kinfer's layout, objects closed (`closed_objects`).
    `lenient`: keywords the engine does not implement are ignored (a looser constraint), not refused."""
    options = {**JSON_LAYOUT, "lenient": True} if lenient else JSON_LAYOUT
    return "%json " + json.dumps({**closed_objects(schema), "x-guidance": options}, ensure_ascii=False)


def closed_objects(schema: Any) -> Any:
    """`schema` with every object that lists its properties, and says nothing of others, closed
    (`additionalProperties: false`, as OpenAI's strict mode requires). What the model writes stays
    valid against the original; a small model would otherwise invent properties and ramble in them.
    Branches of `allOf` stay open: closing each part would reject the properties of the others."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed_objects(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMAS:
            out[key] = closed_objects(value)
        else:
            out[key] = value
    open_keys = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    if isinstance(out.get("properties"), dict) and not any(k in out for k in open_keys):
        out["additionalProperties"] = False
    return out


def check_schema(schema: Any, what: str, *, lenient: bool = False) -> None:
    """Raise `SchemaError` naming `what` when the engine cannot compile `schema`."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{what} must be a JSON object")
    error = _schema_error(json.dumps(schema, sort_keys=True, ensure_ascii=False), lenient)
    if error:
        raise SchemaError(f"{what} cannot be enforced: {error}")


@lru_cache(maxsize=512)
def _schema_error(schema_json: str, lenient: bool) -> str:
    # cached by the schema's text: an agent sends the same tools with every turn
    return grammar_error("start: " + json_rule(json.loads(schema_json), lenient=lenient))


@lru_cache(maxsize=256)
def grammar_error(grammar: str) -> str:
    """llguidance's first complaint about `grammar` (without its location prefix), or ""."""
    message = LLMatcher.validate_grammar(grammar, None)
    if not message:
        return ""
    lines = []
    for line in message.strip().splitlines():
        if _SOURCE_LINE.match(line):
            break  # llguidance then quotes the grammar: ours, not the client's
        if line.strip().strip("^"):
            lines.append(line.strip())
    text = _LOCATION.sub("", " ".join(lines))
    return text.removeprefix("failed to compile JSON schema: ")


# ---- tool calls -------------------------------------------------------------------------------


def tool_call_rules(
    tools: Sequence[ToolSpec], tool_format: ToolFormat, *, parallel: bool, lenient: bool = False
) -> str:
    """Rules defining `calls`: one call (or, `parallel`, calls one per line) of any of `tools`."""
    if not tools:
        raise ValueError("tool_call_rules needs at least one tool")
    xml = tool_format == "qwen3_5_xml"
    rules = ['calls: call ("\\n" call)*' if parallel else "calls: call"]
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    for i, tool in enumerate(tools):
        parameters = tool.parameters or ANY_OBJECT
        check_schema(parameters, f"the parameters of tool {tool.name!r}", lenient=lenient)
        rules.extend(
            _xml_call(i, tool, parameters, lenient) if xml else _hermes_call(i, tool, parameters, lenient)
        )
    if xml:
        rules.append(_XML_TEXT_RULE)
    return "\n".join(rules)


def _hermes_call(i: int, tool: ToolSpec, parameters: dict[str, Any], lenient: bool) -> list[str]:
    head = f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(tool.name, ensure_ascii=False)}, "arguments": '
    tail = f"}}\n{TOOL_CALL_CLOSE}"
    return [
        f"call_{i}: {literal(head)} args_{i} {literal(tail)}",
        f"args_{i}: {json_rule(parameters, lenient=lenient)}",
    ]


def _xml_call(i: int, tool: ToolSpec, parameters: dict[str, Any], lenient: bool) -> list[str]:
    head = f"{TOOL_CALL_OPEN}\n<function={tool.name}>\n"
    tail = f"</function>\n{TOOL_CALL_CLOSE}"
    properties = parameters.get("properties")
    rules: list[str] = []
    if isinstance(properties, dict) and properties:
        required = set(parameters.get("required") or ())
        parts = []
        for j, (key, schema) in enumerate(properties.items()):
            name = f"p_{i}_{j}"
            rules.extend(_xml_parameter(name, key, schema, parameters, lenient))
            parts.append(name if key in required else name + "?")
        body = " ".join(parts)
    else:  # no declared parameters: any names, raw values
        rules.append(f'p_{i}_any: "<parameter=" /[A-Za-z0-9_.-]+/ ">\\n" xml_text')
        body = f"p_{i}_any*"
    return [f"call_{i}: {literal(head)} {body} {literal(tail)}", *rules]


def _xml_parameter(name: str, key: str, schema: Any, tool_schema: dict[str, Any], lenient: bool) -> list[str]:
    head = literal(f"<parameter={key}>\n")
    close = literal("\n</parameter>\n")
    if not isinstance(schema, dict):
        schema = {}
    types = _types(schema)
    enum = schema.get("enum")
    if types <= _STRING_TYPES and isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return [f"{name}: {head} ({' | '.join(literal(v) for v in enum)}) {close}"]
    if types & _STRING_TYPES or (not types and not enum):
        # the parser keeps a string parameter's text as it is: anything up to the closing tag
        return [f"{name}: {head} xml_text"]
    # a JSON value; the tool's own definitions travel along so its $refs still resolve
    standalone = dict(schema)
    for defs in ("$defs", "definitions"):
        if defs in tool_schema and defs not in standalone:
            standalone[defs] = tool_schema[defs]
    return [f"{name}: {head} {name}_v {close}", f"{name}_v: {json_rule(standalone, lenient=lenient)}"]


def _types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {str(t) for t in declared}
    return set()
