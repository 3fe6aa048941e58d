"""Claude Code's per-request `cch=` hash is removed so the prompt prefix stays the same across turns."""

from __future__ import annotations

from kinfer.chat.volatile import strip_volatile_headers

SYSTEM_REST = "You are Claude Code, Anthropic's official CLI for Claude."


def first_block(cch: str) -> str:
    # the first system block as Claude Code 2.1.x sends it
    return f"x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch={cch};\n{SYSTEM_REST}"


def test_cch_is_removed_and_the_rest_of_the_line_kept() -> None:
    assert strip_volatile_headers(first_block("eb6c6")) == (
        f"x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli;\n{SYSTEM_REST}"
    )


def test_two_turns_with_different_hashes_become_identical() -> None:
    assert strip_volatile_headers(first_block("36ee5")) == strip_volatile_headers(first_block("0aaa9"))


def test_header_as_its_own_block_without_newline() -> None:
    block = "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=sdk-cli; cch=71fea;"

    assert (
        strip_volatile_headers(block)
        == "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=sdk-cli;"
    )


def test_cch_elsewhere_is_left_alone() -> None:
    text = "Set cch=abc123; in the config file.\nx-other-header: cch=ff;"

    assert strip_volatile_headers(text) == text


def test_text_without_the_header_is_returned_unchanged() -> None:
    text = "You are a helpful assistant."

    assert strip_volatile_headers(text) is text
