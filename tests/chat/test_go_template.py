"""Ollama `/api/generate` `template`: the Go text/template subset people send, and clear refusals."""

from __future__ import annotations

import pytest

from kinfer.chat.go_template import render_go_template
from kinfer.errors import InvalidRequest

# Ollama's classic ChatML and Llama 3 templates (pre-`.Messages` style)
CHATML = (
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n"
)
LLAMA3 = (
    "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
    "{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>{{ end }}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>"
)


def test_chatml_with_system_and_prompt_stops_where_the_response_goes() -> None:
    text = render_go_template(CHATML, system="Be brief.", prompt="Hi")

    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_empty_system_skips_its_block() -> None:
    text = render_go_template(LLAMA3, prompt="Hi")

    assert text == (
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_if_else_and_else_if() -> None:
    template = "{{ if .System }}S={{ .System }}{{ else if .Prompt }}P={{ .Prompt }}{{ else }}none{{ end }}"

    assert render_go_template(template, system="s", prompt="p") == "S=s"
    assert render_go_template(template, prompt="p") == "P=p"
    assert render_go_template(template) == "none"


@pytest.mark.parametrize(
    ("template", "text"),
    [
        ("A \n {{ .Prompt }} \n B", "A \n hi \n B"),
        ("A \n {{- .Prompt }} \n B", "Ahi \n B"),
        ("A \n {{ .Prompt -}} \n B", "A \n hiB"),
        ("A \n {{- .Prompt -}} \n B", "AhiB"),
        ("[INST] {{- if .System }} {{ .System }} {{- end }}\n {{- .Prompt }}", "[INST] syshi"),
    ],
)
def test_trim_markers_eat_whitespace_on_their_side_only(template: str, text: str) -> None:
    assert render_go_template(template, system="sys", prompt="hi") == text


def test_comments_render_nothing() -> None:
    assert render_go_template("a{{/* note }} with braces */}}b{{- /* trimmed */ -}} c") == "abc"


def test_a_dash_without_a_space_is_not_a_trim_marker() -> None:
    with pytest.raises(InvalidRequest, match=r"\{\{-3\}\}"):
        render_go_template("x {{-3}}")


def test_nothing_after_response_is_rendered_even_inside_branches() -> None:
    template = "{{ if .Prompt }}U:{{ .Prompt }} A:{{ .Response }} END{{ else }}never{{ end }} tail"

    assert render_go_template(template, prompt="q") == "U:q A:"
    assert render_go_template(template) == ""


@pytest.mark.parametrize(
    ("template", "construct"),
    [
        ("{{ range .Messages }}{{ .Content }}{{ end }}", "{{ range .Messages }}"),
        ("{{ .Tools }}", "{{ .Tools }}"),
        ("{{ .System | upper }}", "{{ .System | upper }}"),
        ("{{ if and .System .Prompt }}x{{ end }}", "{{ if and .System .Prompt }}"),
        ('{{ "literal" }}', '{{ "literal" }}'),
        ('{{ template "x" }}', '{{ template "x" }}'),
    ],
)
def test_unsupported_constructs_are_refused_by_name(template: str, construct: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        render_go_template(template, prompt="p")

    assert construct in caught.value.message
    assert "not supported" in caught.value.message


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("{{ if .System }}open", "has no {{ end }}"),
        ("done{{ end }}", "without a matching"),
        ("{{ if .System }}a{{ else }}b{{ else }}c{{ end }}", "after {{ else }}"),
        ("{{ .Prompt ", "unclosed action"),
    ],
)
def test_malformed_templates_are_refused(template: str, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem.replace("{", r"\{").replace("}", r"\}")):
        render_go_template(template)
