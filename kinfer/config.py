"""One configuration schema: CLI flags override `KINFER_*` environment variables override defaults.

Every setting is a field of `Settings`; its metadata names the flag and says what it does, so the
parser, the environment loader and the docs are all generated from this one table.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_PORT = 11500
DEFAULT_HOME = Path("~/.kinfer")


def _setting(default: Any, help: str, *, flag: str | None = None, choices: tuple[str, ...] | None = None):
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


@dataclass(frozen=True)
class Settings:
    """Everything the runtime needs to know, resolved once in `cli.py`."""

    home: Path = _setting(DEFAULT_HOME, "store and state folder (KINFER_HOME)")
    host: str = _setting("127.0.0.1", "address to bind")
    port: int = _setting(DEFAULT_PORT, "port to bind (0 picks a free one)")
    model: str | None = _setting(None, "model to serve when a request names none (default: the store's)")
    parallel: int = _setting(0, "rows decoded together per model (0: automatic)")
    ctx: int = _setting(0, "context length per row (0: automatic)")
    keep_alive: str = _setting("5m", "how long an idle model stays loaded (Ollama syntax: 5m, 30s, 0, -1)")
    prefix_cache: str = _setting("on", "reuse recent prompts' KV", choices=("on", "off"))
    max_loaded: int = _setting(1, "models kept loaded at once")
    max_queue: int = _setting(256, "requests waiting for a row before new ones get 503")
    queue_timeout: float = _setting(300.0, "seconds a request may wait for a row")
    generation_timeout: float = _setting(0.0, "seconds a reply may generate (0: no limit)")
    max_body_mb: float = _setting(32.0, "largest request body, in MiB")
    api_key: str | None = _setting(None, "require this key (Bearer or x-api-key) on every route but /health")
    origins: str = _setting(
        "http://localhost,http://127.0.0.1", "CORS origins allowed, comma separated ('*' for any)"
    )
    mlx_cache_limit_gb: float = _setting(4.0, "cap on MLX's buffer cache, GiB", flag="--mlx-cache-limit")
    threads: int = _setting(0, "CPU threads for llama.cpp (0: the cores available)")
    log_level: str = _setting("info", "logging level", choices=("debug", "info", "warning", "error"))

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def keep_alive_seconds(self) -> float:
        return parse_duration(self.keep_alive)

    @property
    def prefix_cache_enabled(self) -> bool:
        return self.prefix_cache == "on"


_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: str | float | int) -> float:
    """Ollama's keep_alive: a number of seconds or '5m' / '1h30m' / '-1'. Negative means forever."""
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    match = _DURATION.match(text)
    if match:
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    if parts and "".join(n + u for n, u in parts) == text.replace(" ", ""):
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    raise ValueError(f"not a duration: {value!r} (use seconds, or e.g. 30s, 5m, 1h, -1)")


def _flag(f) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _convert(f, raw: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if "Path" in kind:
        return Path(raw)
    if kind.startswith("int"):
        return int(raw)
    if kind.startswith("float"):
        return float(raw)
    return raw


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting; defaults stay None so unset flags fall through to env and defaults."""
    for f in fields(Settings):
        parser.add_argument(
            _flag(f),
            dest=f"setting_{f.name}",
            # SUPPRESS: an unset flag leaves no attribute, so a subcommand's copy of the flags
            # never hides the same flag given before the subcommand
            default=argparse.SUPPRESS,
            choices=f.metadata.get("choices"),
            metavar=None if f.metadata.get("choices") else f.name.upper(),
            help=f.metadata["help"],
        )


def load_settings(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Resolve every setting: flag, then KINFER_<NAME>, then the default."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in fields(Settings):
        raw = getattr(args, f"setting_{f.name}", None) if args is not None else None
        if raw is None:
            raw = env.get(f"KINFER_{f.name.upper()}")
        if raw is None or raw == "":
            continue
        try:
            values[f.name] = _convert(f, str(raw))
        except ValueError as exc:
            raise SystemExit(f"kinfer: bad value for {_flag(f)}: {raw!r} ({exc})") from None
        choices = f.metadata.get("choices")
        if choices and values[f.name] not in choices:
            raise SystemExit(f"kinfer: {_flag(f)} must be one of {', '.join(choices)}")
    settings = Settings(**values)
    settings = replace(settings, home=settings.home.expanduser())
    try:
        parse_duration(settings.keep_alive)
    except ValueError as exc:
        raise SystemExit(f"kinfer: --keep-alive: {exc}") from None
    return settings


def settings_table() -> list[tuple[str, str, str, str]]:
    """(flag, env var, default, help) for every setting, for docs and `--help`."""
    rows = []
    for f in fields(Settings):
        default = "" if f.default is MISSING else str(f.default)
        rows.append((_flag(f), f"KINFER_{f.name.upper()}", default, f.metadata["help"]))
    return rows
