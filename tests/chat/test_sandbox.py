"""A chat template is untrusted input: escapes are refused, failures are clear `InvalidRequest`s."""

from __future__ import annotations

import tracemalloc

import pytest

from kinfer.chat.jinja_env import compile_template
from kinfer.chat.template import render_prompt
from kinfer.errors import InvalidRequest
from kinfer.protocol import ChatRequest, Message

REQUEST = ChatRequest(model="test", messages=(Message("user", "hi"),))


def render(template: str) -> str:
    return render_prompt(template, REQUEST, bos_token="", eos_token="", name="evil:1b").text


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("{{ ''.__class__.__mro__[1].__subclasses__() }}", id="str-class-subclasses"),
        pytest.param("{{ cycler.__init__.__globals__.os.popen('id').read() }}", id="cycler-globals"),
        pytest.param("{{ lipsum.__globals__['os'].system('id') }}", id="lipsum-globals"),
        pytest.param("{{ self.__init__.__globals__ }}", id="template-self"),
        pytest.param("{{ joiner.__init__.__globals__ }}", id="joiner-globals"),
        pytest.param("{% set x = messages.append(1) %}", id="mutate-list"),
        pytest.param("{% set ns = namespace() %}{% set ns.__class__ = 1 %}", id="namespace-dunder"),
        pytest.param("{{ namespace(__init__=1) }}", id="namespace-dunder-kwarg"),
        pytest.param("{{ 'x' * 10**9 }}", id="huge-string"),
        pytest.param("{{ 2 ** 100000000 }}", id="huge-power"),
    ],
)
def test_sandbox_escapes_are_refused(template: str) -> None:
    with pytest.raises(InvalidRequest, match="chat template of evil:1b is not allowed to"):
        render(template)


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("{{ os.system('id') }}", id="no-os"),
        pytest.param("{% include '/etc/passwd' %}", id="no-file-include"),
        pytest.param("{% import 'os' as os %}", id="no-import"),
        pytest.param("{{ range(10**9) | list }}", id="range-capped"),
    ],
)
def test_things_the_sandbox_has_no_way_to_do_fail_cleanly(template: str) -> None:
    with pytest.raises(InvalidRequest, match="chat template of evil:1b failed to render"):
        render(template)


def test_unsafe_attribute_reads_render_empty_never_the_object() -> None:
    # what transformers' environment does too: an unsafe attribute is undefined, and prints as nothing
    assert render("[{{ raise_exception.__globals__ }}][{{ ''|attr('__class__') }}]") == "[][]"


def test_raise_exception_becomes_invalid_request_with_the_templates_message() -> None:
    template = (
        "{% if messages[0].role != 'system' %}{{ raise_exception('System message is required.') }}{% endif %}"
    )

    with pytest.raises(InvalidRequest) as caught:
        render(template)

    assert caught.value.message == "System message is required."
    assert caught.value.status == 400


def test_syntax_error_names_the_template_and_line() -> None:
    with pytest.raises(InvalidRequest, match=r"chat template of evil:1b has a syntax error on line 2"):
        render("{% for m in messages %}\n{% if %}{% endfor %}")


def test_template_runtime_error_is_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="failed to render: UndefinedError"):
        render("{{ messages[5].content }}")


def test_compiled_templates_are_cached_by_source() -> None:
    source = "{{ messages | length }} cached"

    assert compile_template(source) is compile_template(source)


def test_generation_tag_from_training_templates_is_accepted() -> None:
    assert render("{% generation %}{{ messages[0].content }}{% endgeneration %}") == "hi"


def test_loop_controls_are_enabled() -> None:
    assert render("{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "01"


# ---- size: a template may not allocate without bound ---------------------------------------------

MIB = 2**20
# each built 143 MiB or more before the guards: every string- or list-building operation is checked
# from its arguments before it runs, and text is counted once per reference to a string
HUGE = {
    "percent-width": "{{ '%150000000d' % 1 }}",
    "percent-precision": "{{ '%.150000000f' % 1.0 }}",
    "center-filter": "{{ ''|center(300000000) }}",
    "format-width": "{{ '{:>450000000}'.format(1) }}",
    "format-nested-width": "{{ '{:>{}}'.format(1, 450000000) }}",
    "format-filter": "{{ '%150000000d'|format(1) }}",
    "ljust": "{{ 'a'.ljust(300000000) }}",
    "zfill": "{{ '1'.zfill(300000000) }}",
    "join-separator": "{{ (['a'] * 200)|join('x' * 1000000) }}",
    "join-method": "{{ ('x' * 1000000).join(['a'] * 200) }}",
    "replace": "{{ ('a' * 1000)|replace('a', 'b' * 1000000) }}",
    "indent": "{{ ('a\n' * 100000)|indent(10000) }}",
    "wordwrap": "{{ ('a ' * 100000)|wordwrap(1, wrapstring='x' * 10000) }}",
    "truncate-references": "{% set s = 'x' * 1000000 %}{{ ([s] * 1000)|truncate(10**9) }}",
    "tilde-doubling": "{% set ns = namespace(s='x' * 1000000) %}"
    "{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "plus-doubling": "{% set ns = namespace(s=['x'] * 1000) %}"
    "{% for i in range(30) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "list-repeat": "{{ ([1] * 100000000)|length }}",
    "string-repeat": "{{ 'x' * 300000000 }}",
    "printed-references": "{% set s = 'x' * 1000000 %}{{ [s] * 1000 }}",
    "string-filter-references": "{% set s = 'x' * 1000000 %}{{ ([s] * 1000)|string|length }}",
    "percent-references": "{% set s = 'x' * 1000000 %}{{ '%s' % ([s] * 1000,) }}",
    "tojson-indent": "{{ ([[1] * 1000] * 100)|tojson(indent=100000) }}",
    "output-loop": "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s }}{% endfor %}",
    "set-block": "{% set s = 'x' * 1000000 %}"
    "{% set b %}{% for i in range(1000) %}{{ s }}{% endfor %}{% endset %}",
    "lipsum": "{{ lipsum(100000, False, 1000, 1000) }}",
    "batch": "{{ [1]|batch(100000000, 0)|list }}",
    "to-bytes": "{{ (1).to_bytes(1000000000, 'big') }}",
    "power-of-a-power": "{{ (9 ** 9999) ** 9999 }}",
}


@pytest.mark.parametrize("template", HUGE.values(), ids=HUGE.keys())
def test_a_template_that_would_build_too_much_is_refused_before_it_allocates(template: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(
            InvalidRequest, match="chat template of evil:1b is not allowed to build"
        ) as caught:
            render(template)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.status == 400
    assert peak < 48 * MIB, f"{peak / MIB:.0f} MiB allocated before the refusal"


def test_what_one_render_builds_in_all_is_bounded() -> None:
    # each string is under the limit; a loop keeping them all is not
    template = (
        "{% set s = 'x' * 10000000 %}{% set ns = namespace(kept=[]) %}"
        "{% for i in range(1000) %}{% set ns.kept = ns.kept + [s ~ i] %}{% endfor %}"
    )
    with pytest.raises(InvalidRequest, match="more than 134,217,728 characters in one render"):
        render(template)


def test_ordinary_formatting_and_long_prompts_still_render() -> None:
    template = (
        "{{ '%-4s|%5.2f|%03d' % ('a', 1.5, 7) }} {{ '{:>6}|{:.2f}|{!r}'.format('x', 2.0, 'y') }} "
        "{{ 'x'|center(7) }}{{ [1, 2]|join(', ') }} {{ messages|tojson(indent=2)|length }} "
        "{{ ('a b ' * 3)|wordwrap(4)|length }} {{ 'A\nB'|indent(2, true) }} {{ messages[0].content|length }}"
    )
    long = ChatRequest(model="test", messages=(Message("user", "hello world " * 900_000),))
    text = render_prompt(template, long, bos_token="", eos_token="", name="evil:1b").text
    assert text == "a   | 1.50|007      x|2.00|'y'    x   1, 2 10800049 11   A\n  B 10800000"
