"""How much a chat template may build: the size guards the sandbox (`jinja_env`) applies.

Jinja's sandbox stops a template from reaching Python, not from allocating: `'%150000000d' % 1`,
`''|center(300000000)` and `'{:>450000000}'.format(1)` each build a 143 MiB string, and a string
printed inside a list (`{{ [s] * 1000 }}`) is copied once per reference. So every operation that
builds text or a list is checked *before* it runs, from its arguments: no single string or list may
exceed `MAX_TEXT` characters / `MAX_ITEMS` items, the rendered prompt neither, and one render may
build at most `MAX_WORK` characters in all (what a loop could keep in a namespace). A template that
goes past a limit raises `SecurityError`, which `render_template` turns into a 400.
"""

from __future__ import annotations

import contextvars
import functools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jinja2.utils
from jinja2.sandbox import SecurityError

MAX_TEXT = 16 * 2**20  # characters in any one string a template builds, and in the rendered prompt
MAX_ITEMS = 1_000_000  # items in any one list (Jinja's sandbox already caps range() at 100 000)
MAX_WORK = 8 * MAX_TEXT  # characters built by guarded operations in one render, all told
MAX_INT_BITS = 2**20  # a number of 315 000 digits is more than any template needs
MAX_EXPONENT = 10_000

_BUDGET: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("template_budget", default=None)
# %-format specs: %[(key)][flags][width][.precision][length]type
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?[a-zA-Z%]")
_NUMBER = re.compile(r"\d+")


@contextmanager
def render_budget() -> Iterator[None]:
    """Count what one render builds against `MAX_WORK` (guards outside a render check sizes only)."""
    token = _BUDGET.set([0])
    try:
        yield
    finally:
        _BUDGET.reset(token)


def limit(size: int, what: str = "a string", unit: str = "characters") -> None:
    """Refuse to build `what` of `size` (checked before building it)."""
    most = MAX_ITEMS if unit == "items" else MAX_TEXT
    if size > most:
        raise SecurityError(f"build {what} of {size:,} {unit} (the limit is {most:,})")


def charge(size: int) -> None:
    """Count what was built against the render's budget."""
    budget = _BUDGET.get()
    if budget is not None:
        budget[0] += size
        if budget[0] > MAX_WORK:
            raise SecurityError(f"build more than {MAX_WORK:,} characters in one render")


def text_size(value: Any, limit: int = MAX_TEXT) -> int:
    """About `len(str(value))` (and of its repr or JSON), without building it.

    Walks containers without recursion, counting a string once per reference to it, and stops as
    soon as the count passes `limit`, so it costs at most `limit` steps.
    """
    if isinstance(value, str):
        return len(value)
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item) + 3
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2
        elif isinstance(item, float):
            total += 24
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            if total <= limit:
                stack.extend(item.keys())
                stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 + 2 * len(item)
            if total <= limit:
                stack.extend(item)
        elif isinstance(item, jinja2.utils.Namespace):
            total += 16
            stack.append(dict(item._Namespace__attrs))  # type: ignore[attr-defined]
        else:
            total += 64  # Undefined, generators, cyclers: their str() is short
        if total > limit:
            return total
    return total


def allow_text_of(value: Any, what: str = "a string") -> None:
    """Refuse a value whose text (str, repr or JSON) would be too long: a list of many references
    to one long string is short in memory and huge as text."""
    if not isinstance(value, str):
        size = text_size(value)
        if size > MAX_TEXT:
            raise SecurityError(f"build {what} of over {MAX_TEXT:,} characters")


def checked_result(value: Any, what: str = "a string") -> Any:
    """After the fact, for what could not be predicted: refuse a result that is too big, and count it."""
    if isinstance(value, str | bytes):
        limit(len(value), what)
        charge(len(value))
    elif isinstance(value, list | tuple):
        limit(len(value), "a list", unit="items")
        charge(len(value))
    return value


def _count(value: Any) -> int | None:
    return len(value) if isinstance(value, str | bytes | list | tuple) else None


# ---- operators ------------------------------------------------------------------------------


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Before `left <operator> right` runs."""
    if operator == "**":
        if isinstance(right, int) and abs(right) > MAX_EXPONENT and left not in (0, 1, -1):
            raise SecurityError(f"raise a number to the power {right}")
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            _allow_bits(left.bit_length() * right)
    elif operator == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(count, int) and not isinstance(count, bool) and (n := _count(seq)) is not None:
                unit = "items" if isinstance(seq, list | tuple) else "characters"
                limit(n * max(count, 0), "a sequence", unit=unit)
                return
        if isinstance(left, int) and isinstance(right, int):
            _allow_bits(left.bit_length() + right.bit_length())
    elif operator == "+":
        if (a := _count(left)) is not None and (b := _count(right)) is not None:
            unit = "items" if isinstance(left, list | tuple) else "characters"
            limit(a + b, "a sequence", unit=unit)
    elif operator == "%" and isinstance(left, str):
        check_percent_format(left, right)


def _allow_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise SecurityError(f"build a number of {bits:,} bits (the limit is {MAX_INT_BITS:,})")


def check_percent_format(template: str, args: Any) -> None:
    """`template % args`: the widths and precisions it asks for, plus the text of its arguments."""
    size = len(template) + text_size(args)
    for width, precision in _PERCENT_SPEC.findall(template):
        if "*" in (width, precision):
            raise SecurityError("build a %-format whose width comes from its arguments ('*')")
        size += max(int(width or 0), int(precision or 0)) + 32
    limit(size, "a formatted string")


def format_field_size(spec: str, value: Any) -> int:
    """One `{...:spec}` field of `str.format`: every number in the spec may be a width or precision."""
    allow_text_of(value, "a formatted string")
    return max((int(n) for n in _NUMBER.findall(spec)), default=0) + text_size(value)


def streamed_text(chunks: Iterator[str], what: str = "a string") -> str:
    """Join chunks made lazily (`JSONEncoder.iterencode`), stopping at the limit rather than after it."""
    collected = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        limit(size, what)
        collected.append(chunk)
    charge(size)
    return "".join(collected)


def joined(parts: tuple[Any, ...]) -> str:
    """`a ~ b ~ c`: the size is known before joining."""
    size = 0
    for part in parts:
        size += text_size(part, MAX_TEXT - size + 1)
        if size > MAX_TEXT:
            break
    limit(size, "a string")
    text = "".join(map(str, parts))
    charge(len(text))
    return text


def bounded_concat(parts: Any) -> str:
    """The environment's `concat`: joins the output of a template, a block or a macro."""
    collected = []
    size = 0
    for part in parts:
        size += len(part)
        if size > MAX_TEXT:
            raise SecurityError(f"build a prompt of over {MAX_TEXT:,} characters")
        collected.append(part)
    charge(size)
    return "".join(collected)


def finalize(value: Any) -> Any:
    """Applied to every `{{ ... }}` before it is turned into text."""
    allow_text_of(value, "an output")
    return value


# ---- method calls: str.center, .ljust, .join, ... -------------------------------------------


def _padded(obj: Any, args: tuple, kwargs: dict) -> int:
    width = args[0] if args else kwargs.get("width", 0)
    return max(len(obj), width if isinstance(width, int) else 0)


def _expandtabs(obj: Any, args: tuple, kwargs: dict) -> int:
    tabsize = args[0] if args else kwargs.get("tabsize", 8)
    return len(obj) + obj.count("\t" if isinstance(obj, str) else b"\t") * max(int(tabsize), 0)


def _replace(obj: Any, args: tuple, kwargs: dict) -> int:
    if len(args) < 2 or not isinstance(args[0], type(obj)) or not isinstance(args[1], type(obj)):
        return len(obj)
    old, new = args[0], args[1]
    count = args[2] if len(args) > 2 else kwargs.get("count", -1)
    hits = obj.count(old) if old else len(obj) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(obj) + hits * max(len(new) - len(old), 0)


def _translate(obj: Any, args: tuple, kwargs: dict) -> int:
    table = args[0] if args else None
    longest = max((text_size(v) for v in table.values()), default=1) if isinstance(table, dict) else 1
    return len(obj) * max(longest, 1)


STR_METHOD_SIZES: dict[str, Callable[[Any, tuple, dict], int]] = {
    "center": _padded,
    "ljust": _padded,
    "rjust": _padded,
    "zfill": _padded,
    "expandtabs": _expandtabs,
    "replace": _replace,
    "translate": _translate,
}


def call_with_limits(call: Callable[..., Any], obj: Any, args: tuple, kwargs: dict) -> Any:
    """`obj(*args, **kwargs)` from a template: predicted where the size can be, checked after."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, str | bytes) and name in STR_METHOD_SIZES:
        limit(STR_METHOD_SIZES[name](owner, args, kwargs), "a string")
    elif isinstance(owner, str | bytes) and name == "join" and args:
        items = list(args[0])
        limit(len(items), "a list", unit="items")
        limit(_joined_size(items, owner), "a string")
        args = (items, *args[1:])
    elif isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        limit(length if isinstance(length, int) else 0, "a byte string")
    return checked_result(call(obj, *args, **kwargs))


# ---- filters and globals --------------------------------------------------------------------


def _filter_join(value: Any, d: Any = "", attribute: Any = None) -> tuple[Any, ...]:
    items = list(value)
    limit(len(items), "a list", unit="items")
    if attribute is None:  # else the attributes are joined: their size shows in the result
        limit(_joined_size(items, d), "a string")
    return (items,)


def _joined_size(items: list[Any], separator: Any) -> int:
    size = text_size(separator) * max(len(items) - 1, 0)
    for item in items:
        size += text_size(item, MAX_TEXT - size + 1)
        if size > MAX_TEXT:
            break
    return size


def _filter_center(value: Any, width: Any = 80) -> None:
    limit(max(text_size(value), width if isinstance(width, int) else 0), "a string")


def _filter_indent(value: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    step = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    limit(text_size(value) + (str(value).count("\n") + 1) * max(step, 0), "a string")


def _filter_wordwrap(
    value: Any, width: Any = 79, break_long_words: Any = True, wrapstring: Any = None, *_: Any, **__: Any
) -> None:
    n = text_size(value)
    short = break_long_words and isinstance(width, int) and width >= 1
    lines = (n // width if short else n) + str(value).count("\n") + 1
    limit(n + lines * max(text_size(wrapstring or "\n"), 1), "a string")


def _filter_replace(value: Any, old: Any = "", new: Any = "", count: Any = None) -> None:
    allow_text_of(old)
    allow_text_of(new)
    limit(_replace(str(value), (str(old), str(new), -1 if count is None else count), {}), "a string")


def _filter_format(value: Any, *args: Any, **kwargs: Any) -> None:
    check_percent_format(str(value), kwargs or args)


def _filter_items(value: Any, count: Any = 0, *_: Any, **__: Any) -> None:
    limit(count if isinstance(count, int) else 0, "a list", unit="items")


def _filter_list(value: Any) -> None:
    if isinstance(value, str | list | tuple | dict):
        limit(len(value), "a list", unit="items")


def _filter_sum(value: Any, attribute: Any = None, start: Any = 0) -> tuple[Any, ...]:
    items = list(value)
    if isinstance(start, list | tuple) and attribute is None:
        counted = sum(len(v) for v in items if isinstance(v, list | tuple)) + len(start)
        limit(counted, "a list", unit="items")
    return (items,)


# filter name -> check of its arguments (value first); may return replacement arguments
FILTER_CHECKS: dict[str, Callable[..., Any]] = {
    "join": _filter_join,
    "center": _filter_center,
    "indent": _filter_indent,
    "wordwrap": _filter_wordwrap,
    "replace": _filter_replace,
    "format": _filter_format,
    "batch": _filter_items,
    "slice": _filter_items,
    "list": _filter_list,
    "sum": _filter_sum,
}
# filters that turn their value into text: a list of references to one long string is refused first
TEXT_FILTERS = frozenset(
    {
        "capitalize",
        "center",
        "format",
        "indent",
        "replace",
        "wordwrap",
        "e",
        "escape",
        "forceescape",
        "lower",
        "pprint",
        "safe",
        "string",
        "striptags",
        "title",
        "tojson",
        "trim",
        "truncate",
        "upper",
        "urlencode",
        "urlize",
        "wordcount",
        "xmlattr",
    }
)


def bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` with its arguments checked before it runs and its result after."""
    check = FILTER_CHECKS.get(name)
    if check is None and name not in TEXT_FILTERS:
        return func
    # a filter marked @pass_context / @pass_eval_context / @pass_environment gets that first
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        head, rest = args[:skip], args[skip:]
        if rest:
            if name in TEXT_FILTERS:
                allow_text_of(rest[0])
            if check is not None:
                replaced = check(*rest, **kwargs)
                if replaced is not None:
                    rest = (*replaced, *rest[len(replaced) :])
        return checked_result(func(*head, *rest, **kwargs))

    return guarded


def bounded_lipsum(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> Any:
        limit(int(n) * int(max) * 12, "a string")
        return checked_result(func(n, html, min, max))

    return lipsum
