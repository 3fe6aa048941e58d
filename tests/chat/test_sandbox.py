"""A chat template is untrusted input: escapes are refused, failures are clear `InvalidRequest`s."""

from __future__ import annotations

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
