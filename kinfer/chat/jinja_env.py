"""The sandboxed Jinja environment chat templates run in, shaped like transformers' `apply_chat_template`.

A chat template ships with the model file, so it is untrusted input: it runs in Jinja's
`ImmutableSandboxedEnvironment` (no private attributes, no mutating lists or dicts), with the globals
Hugging Face templates expect and nothing more. Every failure becomes `InvalidRequest`.
"""

from __future__ import annotations

import functools
import json
import logging
import types
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import (
    ImmutableSandboxedEnvironment,
    SandboxedEscapeFormatter,
    SandboxedFormatter,
    SecurityError,
)
from markupsafe import Markup

from kinfer.chat.jinja_limits import (
    allow_text_of,
    bounded_concat,
    bounded_filter,
    bounded_lipsum,
    call_with_limits,
    check_binop,
    checked_result,
    finalize,
    format_field_size,
    joined,
    limit,
    render_budget,
    streamed_text,
)
from kinfer.errors import InvalidRequest

log = logging.getLogger(__name__)

TEMPLATE_CACHE_SIZE = 32


class TemplateRaised(Exception):
    """`raise_exception(message)` called from inside a template."""


def _raise_exception(message: Any) -> None:
    allow_text_of(message, "an error message")
    raise TemplateRaised(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' filter: Jinja's own tojson escapes <, >, & and ' for HTML, which changes the prompt.
    # Encoded lazily, so an `indent` of a million spaces stops at the size limit, not after it.
    encoder = json.JSONEncoder(
        ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    return streamed_text(encoder.iterencode(value), "a JSON text")


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


class _BoundedFormatter:
    """`str.format` fields, each checked before it is converted and padded (see `jinja_limits`)."""

    _built = 0

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        self._built = len(format_string)
        return checked_result(super().vformat(format_string, args, kwargs))  # type: ignore[misc]

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        allow_text_of(value, "a formatted string")
        return super().convert_field(value, conversion)  # type: ignore[misc]

    def format_field(self, value: Any, format_spec: str) -> Any:
        self._built += format_field_size(format_spec, value)
        limit(self._built, "a formatted string")
        return super().format_field(value, format_spec)  # type: ignore[misc]


class _Formatter(_BoundedFormatter, SandboxedFormatter):
    pass


class _EscapeFormatter(_BoundedFormatter, SandboxedEscapeFormatter):
    pass


class _CodeGenerator(CodeGenerator):
    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        # `a ~ b`: Jinja joins without looking; ours checks the size first (our autoescape is off)
        self.write("environment.joined((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _ChatTemplateSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with every operation that builds text or a list bounded (see `jinja_limits`)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CodeGenerator
    concat = staticmethod(bounded_concat)  # every template, block and macro output is joined here
    joined = staticmethod(joined)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        check_binop(operator, left, right)
        return checked_result(self.binop_table[operator](left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if not __self.is_safe_callable(__obj):
            raise SecurityError(f"{__obj!r} is not safely callable")
        return call_with_limits(__context.call, __obj, args, kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        # Jinja's own, with a formatter that checks widths and field sizes before padding
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        owner = value.__self__
        if not isinstance(owner, str):
            return None
        formatter = (
            _EscapeFormatter(self, escape=owner.escape) if isinstance(owner, Markup) else _Formatter(self)
        )
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one positional argument")
                kwargs, args = args[0], ()
            return type(owner)(formatter.vformat(owner, args, kwargs))

        return functools.update_wrapper(wrapper, value)


def make_environment() -> jinja2.Environment:
    """A fresh sandboxed environment with the Hugging Face chat-template globals and filters."""
    env = _ChatTemplateSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
        finalize=finalize,
    )
    env.filters["tojson"] = _tojson
    env.filters.update({name: bounded_filter(name, func) for name, func in env.filters.items()})
    env.globals["lipsum"] = bounded_lipsum(env.globals["lipsum"])
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
        with render_budget():
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
