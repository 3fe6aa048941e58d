"""The sandboxed Jinja environment chat templates run in, shaped like transformers' `apply_chat_template`.

A chat template ships with the model file, so it is untrusted input: it runs in Jinja's
`ImmutableSandboxedEnvironment` (no private attributes, no mutating lists or dicts), with the globals
Hugging Face templates expect and nothing more. Every failure becomes `InvalidRequest`.
"""

from __future__ import annotations

import functools
import json
import logging
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from kinfer.errors import InvalidRequest

log = logging.getLogger(__name__)

# Guards for the two operators that can allocate without bound in one expression ('x' * 10**12);
# Jinja's sandbox already caps range() at 100 000 items.
MAX_REPEAT_LENGTH = 10_000_000
MAX_EXPONENT = 10_000
TEMPLATE_CACHE_SIZE = 32


class TemplateRaised(Exception):
    """`raise_exception(message)` called from inside a template."""


def _raise_exception(message: Any) -> None:
    raise TemplateRaised(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' filter: Jinja's own tojson escapes <, >, & and ' for HTML, which changes the prompt
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates, without exposing the `dict` type itself (as transformers does)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A Jinja namespace that refuses underscore names, so `{% set ns.__x__ = ... %}` cannot plant dunders."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"store the private name {name!r} on a namespace")


class _GenerationTag(jinja2.ext.Extension):
    """Accept transformers' `{% generation %}...{% endgeneration %}` (assistant-mask marker) as a no-op."""

    tags = {"generation"}  # noqa: RUF012 - Jinja reads this class attribute

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _ChatTemplateSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(right, int) and abs(right) > MAX_EXPONENT and left not in (0, 1, -1):
                raise SecurityError(f"raise a number to the power {right}")
            return left**right
        for seq, count in ((left, right), (right, left)):
            too_long = (
                isinstance(seq, str | list | tuple)
                and isinstance(count, int)
                and len(seq) * count > MAX_REPEAT_LENGTH
            )
            if too_long:
                raise SecurityError(f"build a sequence of {len(seq) * count} items")
        return left * right


def make_environment() -> jinja2.Environment:
    """A fresh sandboxed environment with the Hugging Face chat-template globals and filters."""
    env = _ChatTemplateSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


_ENV = make_environment()


@functools.lru_cache(maxsize=TEMPLATE_CACHE_SIZE)
def compile_template(source: str) -> jinja2.Template:
    """Compile a template once per distinct source; raises `jinja2.TemplateSyntaxError` on bad syntax."""
    return _ENV.from_string(source)


def template_variables(source: str) -> frozenset[str] | None:
    """The variables a template reads from its caller (`messages`, `tools`...); None if it cannot parse."""
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(_ENV.parse(source)))
    except jinja2.TemplateSyntaxError:
        return None


def render_template(source: str, variables: dict[str, Any], *, label: str = "chat template") -> str:
    """Render `source` with `variables` in the sandbox; every failure becomes `InvalidRequest`.

    `label` names the template in error messages (e.g. "the chat template of qwen3:0.6b").
    """
    try:
        template = compile_template(source)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidRequest(f"{label} has a syntax error on line {exc.lineno}: {exc.message}") from exc
    try:
        return template.render(**variables)
    except TemplateRaised as exc:
        # the template's own words, e.g. "Conversation roles must alternate user/assistant/..."
        raise InvalidRequest(str(exc)) from exc
    except SecurityError as exc:
        log.warning("%s tried something the sandbox refuses: %s", label, exc)
        raise InvalidRequest(f"{label} is not allowed to {_describe(exc)}") from exc
    except Exception as exc:
        raise InvalidRequest(f"{label} failed to render: {type(exc).__name__}: {exc}") from exc


def _describe(exc: SecurityError) -> str:
    # our own guards phrase their message as a verb ("store ...", "build ..."); Jinja's are sentences
    message = str(exc).rstrip(".")
    if message.startswith(("store ", "build ", "raise ")):
        return message
    return f"do this ({message})"
