"""The one settings schema: flags over KINFER_* over defaults, Ollama durations, docs kept true."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kinfer.cli import build_parser
from kinfer.config import (
    DIAGNOSTIC,
    Settings,
    add_server_arguments,
    load_settings,
    parse_duration,
    settings_table,
)

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


def test_engine_switches_keep_their_environment_names_and_take_on_off_or_1_0():
    assert parse([], {}).mlx_fused_decode is True
    assert parse([], {"KINFER_MLX_FUSED_DECODE": "0"}).mlx_fused_decode is False
    assert parse([], {"KINFER_MLX_GATED_DELTA": "off"}).mlx_gated_delta is False
    assert parse(["--mlx-gated-delta", "on"], {"KINFER_MLX_GATED_DELTA": "0"}).mlx_gated_delta is True
    # three states: auto (the engine decides: on a GPU only), or forced on or off
    assert parse([], {}).mlx_fuse_projections is None
    assert parse([], {"KINFER_MLX_FUSE_PROJECTIONS": "1"}).mlx_fuse_projections is True
    assert parse(["--mlx-fuse-projections", "off"], {}).mlx_fuse_projections is False
    assert (
        parse(["--mlx-fuse-projections", "auto"], {"KINFER_MLX_FUSE_PROJECTIONS": "1"}).mlx_fuse_projections
        is None
    )
    with pytest.raises(SystemExit, match="--mlx-fused-decode"):
        parse([], {"KINFER_MLX_FUSED_DECODE": "auto"})  # a plain switch has no auto
    with pytest.raises(SystemExit, match="--exact-prefix"):
        parse(["--exact-prefix", "sometimes"], {})


def test_engine_knobs_are_settings():
    settings = parse(["--gpu-layers", "0", "--step-tokens", "64"], {"KINFER_PREFILL_CHUNK": "32"})
    assert (settings.gpu_layers, settings.step_tokens, settings.prefill_chunk) == (0, 64, 32)
    assert parse([], {"KINFER_EXACT_PREFIX": "1"}).exact_prefix is True
    assert parse([], {"KINFER_MLX_SELF_CHECK": "no"}).mlx_self_check is False


def test_help_shows_engine_settings_but_not_diagnostics_which_still_parse():
    parser = build_parser()
    text = parser.format_help()
    assert "--gpu-layers" in text and "--prefill-chunk" in text and "docs/configuration.md" in text
    for flag, _env, _default, _help in settings_table(DIAGNOSTIC):
        assert flag not in text
    args = parser.parse_args(["--mlx-fused-decode", "off", "list"])
    assert load_settings(args, {}).mlx_fused_decode is False


def test_the_configuration_doc_lists_every_setting():
    doc = DOCS.read_text()
    for flag, env, default, help_text in settings_table():
        assert f"| `{flag}` | `{env}` | `{default}` | {help_text} |" in doc, flag
