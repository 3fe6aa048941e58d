"""The subset of Go's text/template that Ollama `/api/generate` clients send as `template`.

Supported: `{{ .System }}`, `{{ .Prompt }}`, `{{ .Response }}`, `{{ if .X }}` / `{{ else if .X }}` /
`{{ else }}` / `{{ end }}`, `{{/* comments */}}`, and `{{-` / `-}}` whitespace trimming. Anything else
is refused with `InvalidRequest` naming the construct. As in Ollama, the template is cut at
`{{ .Response }}`: that is where the model's reply goes, so nothing after it is part of the prompt.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from kinfer.errors import InvalidRequest

FIELDS = ("System", "Prompt", "Response")
_WS = " \t\r\n"
_FIELD_RE = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Field:
    name: str


@dataclass(frozen=True)
class _If:
    branches: tuple[tuple[str | None, tuple[_Node, ...]], ...]  # (field tested or None for else, body)


_Node = _Text | _Field | _If


@dataclass(frozen=True)
class _Action:
    body: str  # the action's words, trim markers and spaces removed
    source: str  # as written, for error messages


def render_go_template(template: str, *, system: str = "", prompt: str = "", response: str = "") -> str:
    """Render an Ollama-style Go template with these values; raises `InvalidRequest` if unsupported."""
    values = {"System": system, "Prompt": prompt, "Response": response}
    out: list[str] = []
    _render(parse_go_template(template), values, out)
    return "".join(out)


@functools.lru_cache(maxsize=32)
def parse_go_template(template: str) -> tuple[_Node, ...]:
    """Parse (and validate) a template; raises `InvalidRequest` naming the first unsupported construct."""
    return _Parser(_lex(template)).parse()


def _lex(source: str) -> list[str | _Action]:
    """Split into text and actions, applying `{{-` / `-}}` trimming to the neighbouring text."""
    items: list[str | _Action] = []
    pos = 0
    trim_next = False
    while True:
        start = source.find("{{", pos)
        text = source[pos:] if start < 0 else source[pos:start]
        if trim_next:
            text = text.lstrip(_WS)
        if start < 0:
            items.append(text)
            return items
        inner_at = start + 2
        trim_left = source.startswith("-", inner_at) and source[inner_at + 1 : inner_at + 2] in tuple(_WS)
        if trim_left:
            text = text.rstrip(_WS)
            inner_at += 2
        items.append(text)
        stripped_at = inner_at
        while stripped_at < len(source) and source[stripped_at] in _WS:
            stripped_at += 1
        if source.startswith("/*", stripped_at):
            # a comment may contain "}}", so find its own end first
            close = source.find("*/", stripped_at + 2)
            end = source.find("}}", close) if close >= 0 else -1
        else:
            end = source.find("}}", inner_at)
        if end < 0:
            raise InvalidRequest(f"template has an unclosed action: {source[start : start + 40]!r}")
        inner = source[inner_at:end]
        trim_next = len(inner) >= 2 and inner.endswith("-") and inner[-2] in _WS
        if trim_next:
            inner = inner[:-1]
        items.append(_Action(inner.strip(_WS), source[start : end + 2]))
        pos = end + 2


class _Parser:
    def __init__(self, items: list[str | _Action]) -> None:
        self._items = items
        self._at = 0
        self._cut = False  # past {{ .Response }}: Ollama drops every node after it

    def parse(self) -> tuple[_Node, ...]:
        body, stop = self._block()
        if stop is not None:
            raise InvalidRequest(f"template has {{{{ {stop.body} }}}} without a matching {{{{ if }}}}")
        return body

    def _block(self) -> tuple[tuple[_Node, ...], _Action | None]:
        """Nodes up to the end of input or an `else` / `end` action, which is returned unconsumed."""
        nodes: list[_Node] = []
        while self._at < len(self._items):
            item = self._items[self._at]
            if isinstance(item, str):
                self._at += 1
                if item and not self._cut:
                    nodes.append(_Text(item))
                continue
            word = item.body.split(maxsplit=1)[0] if item.body else ""
            if word in ("else", "end"):
                return tuple(nodes), item
            self._at += 1
            if item.body.startswith("/*"):
                continue
            if word == "if":
                cut_before = self._cut
                node = self._if(item)
                if not cut_before:
                    nodes.append(node)
                continue
            name = _field(item.body, item)
            if not self._cut:
                nodes.append(_Field(name))
            if name == "Response":
                self._cut = True
        return tuple(nodes), None

    def _if(self, opening: _Action) -> _If:
        branches: list[tuple[str | None, tuple[_Node, ...]]] = []
        condition: str | None = _field(opening.body[2:].strip(), opening)
        while True:
            body, stop = self._block()
            # after a cut the bodies come back empty, which renders what Ollama's pruned tree renders
            branches.append((condition, body))
            if stop is None:
                raise InvalidRequest(f"template's {opening.source} has no {{{{ end }}}}")
            self._at += 1
            words = stop.body.split()
            if words == ["end"]:
                return _If(tuple(branches))
            if words == ["else"]:
                condition = None
            elif words[:2] == ["else", "if"] and len(words) == 3:
                condition = _field(words[2], stop)
            else:
                raise InvalidRequest(f"template construct {stop.source} is not supported")
            if branches and branches[-1][0] is None:
                raise InvalidRequest(f"template has {stop.source} after {{{{ else }}}}")


def _field(expression: str, action: _Action) -> str:
    match = _FIELD_RE.fullmatch(expression.strip())
    if match is None or match.group(1) not in FIELDS:
        raise InvalidRequest(
            f"template construct {action.source} is not supported: kinfer renders only "
            "{{ .System }}, {{ .Prompt }}, {{ .Response }} and {{ if .X }}...{{ else }}...{{ end }}"
        )
    return match.group(1)


def _render(nodes: tuple[_Node, ...], values: dict[str, str], out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Field):
            out.append(values[node.name])
        else:
            for condition, body in node.branches:
                if condition is None or values[condition]:
                    _render(body, values, out)
                    break
