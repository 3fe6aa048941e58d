"""The one settings schema: flags over KINFER_* over defaults, Ollama durations, docs kept true."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kinfer.config import Settings, add_server_arguments, load_settings, parse_duration, settings_table

DOCS = Path(__file__).parent.parent / "docs" / "configuration.md"


def parse(argv: list[str], env: dict[str, str]) -> Settings:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return load_settings(parser.parse_args(argv), env)


def test_a_flag_beats_the_environment_which_beats_the_default():
    assert parse([], {}).port == 11500
    assert parse([], {"KINFER_PORT": "9000"}).port == 9000
    assert parse(["--port", "9100"], {"KINFER_PORT": "9000"}).port == 9100
    assert parse([], {"KINFER_HOME": "~/x"}).home == Path("~/x").expanduser()
    assert parse(["--prefix-cache", "off"], {}).prefix_cache_enabled is False


def test_bad_values_stop_with_a_message():
    with pytest.raises(SystemExit, match="--parallel"):
        parse([], {"KINFER_PARALLEL": "many"})
    with pytest.raises(SystemExit, match="keep-alive"):
        parse(["--keep-alive", "soon"], {})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300), ("30s", 30), ("1h30m", 5400), ("0", 0), ("-1", -1), ("250ms", 0.25), (12, 12)],
)
def test_durations_follow_ollama(text, seconds):
    assert parse_duration(text) == seconds


def test_the_configuration_doc_lists_every_setting():
    doc = DOCS.read_text()
    for flag, env, _default, help_text in settings_table():
        assert f"`{flag}`" in doc and f"`{env}`" in doc and help_text in doc, flag
