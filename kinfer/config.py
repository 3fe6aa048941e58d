"""One configuration schema: CLI flags override `KINFER_*` environment variables override defaults.

Every setting is a field of `Settings`; its metadata names the flag, says what it does and which group
it belongs to, so the parser, the environment loader and the docs are all generated from this one table.
Engines never read the environment: `engines/loader.py` hands them plain values from `Settings`.
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


# groups of settings: the first two are shown by `kinfer --help`; diagnostics are accepted as flags and
# variables like every setting but listed only in docs/configuration.md
SERVER = "server and store settings"
ENGINE = "engine settings"
DIAGNOSTIC = "engine diagnostics"

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def _setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    group: str = SERVER,
):
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices, "group": group})


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
    shutdown_grace: float = _setting(
        30.0, "seconds replies in flight may take to finish on SIGTERM / Ctrl-C before they are ended"
    )
    max_body_mb: float = _setting(32.0, "largest request body, in MiB")
    api_key: str | None = _setting(None, "require this key (Bearer or x-api-key) on every route but /health")
    origins: str = _setting(
        "http://localhost,http://127.0.0.1", "CORS origins allowed, comma separated ('*' for any)"
    )
    allowed_hosts: str | None = _setting(
        None, "Host names answered besides localhost and loopback IPs, comma separated ('*' for any)"
    )
    log_level: str = _setting("info", "logging level", choices=("debug", "info", "warning", "error"))
    distributed: Path | None = _setting(
        None,
        "serve one MLX model sharded across the hosts of this mlx.launch hostfile (docs/distributed.md)",
    )
    distributed_port: int = _setting(
        0, "rank 0's port for the ranks' heartbeats (0: the port below the ring's first)"
    )

    memory_budget_gb: float = _setting(
        0.0,
        "GiB one loaded model may hold: weights, KV, recurrent state, prefix pool, scratch and MLX's cache "
        "(0: 3/4 of RAM or unified memory, 9/10 of a CUDA GPU's; -1: no budget)",
        flag="--memory-budget",
        group=ENGINE,
    )
    threads: int = _setting(
        0,
        "llama.cpp: CPU threads (0: the cores available, decode steps on fewer while other processes "
        "want them; N: fixed at N)",
        group=ENGINE,
    )
    embed_contexts: int = _setting(
        0,
        "llama.cpp on a CPU: embedding contexts decoding passes in parallel, sharing --threads "
        "(0: one per thread)",
        group=ENGINE,
    )
    gpu_layers: int = _setting(-1, "llama.cpp: layers offloaded to a GPU (-1: all, 0: none)", group=ENGINE)
    flash_attn: bool | None = _setting(
        None,
        "llama.cpp: flash attention in reply contexts (auto: on a GPU; on a CPU, on with the "
        "batch-invariant kernel scripts/setup.sh builds, off with a stock llama-cpp-python, whose "
        "kernel would make a batched or pooled reply part from its solo run)",
        group=ENGINE,
    )
    step_tokens: int = _setting(
        0, "llama.cpp: tokens per forward pass, replies first, then prompt chunks (0: 2048)", group=ENGINE
    )
    mlx_cache_limit_gb: float = _setting(
        4.0, "MLX: cap on the buffer cache, GiB", flag="--mlx-cache-limit", group=ENGINE
    )
    prefill_chunk: int = _setting(
        0, "MLX: prompt tokens prefilled per step (0: 2048 on a GPU, 128 on a CPU)", group=ENGINE
    )
    step_budget_ms: float = _setting(
        0.0,
        "both engines: step time aimed at while replies decode; prompt chunks beside them shrink or grow "
        "with the measured prefill speed to fit it "
        "(0: automatic, 2.5 decode steps, at least 50 ms on a GPU, 300 ms on a CPU)",
        group=ENGINE,
    )

    exact_prefix: bool = _setting(
        False,
        "llama.cpp: adopt only whole saved prompts, on every model (recurrent ones always do)",
        group=DIAGNOSTIC,
    )
    mlx_self_check: bool = _setting(
        True, "MLX: at load, check the batched caches against mlx-lm's own forward pass", group=DIAGNOSTIC
    )
    mlx_fused_decode: bool = _setting(
        True,
        "MLX on CUDA: the fused paged decode-attention kernel (off: the portable path)",
        group=DIAGNOSTIC,
    )
    mlx_gated_delta: bool = _setting(
        True,
        "MLX on CUDA: the GatedDeltaNet recurrence kernel of Qwen3.5-style models (off: mlx-lm's path)",
        group=DIAGNOSTIC,
    )
    mlx_precompiled_kernels: bool = _setting(
        False,
        "MLX on CUDA: those kernels compiled once with NVRTC, checked, launched precompiled (off: JIT call)",
        group=DIAGNOSTIC,
    )
    mlx_compiled_step: bool = _setting(
        True,
        "MLX: one-token passes, and on CUDA one row's prompt chunks, as mx.compile'd functions "
        "(llama, qwen2, qwen3: the whole pass; qwen3_5: each layer) (off: mlx-lm's module code)",
        group=DIAGNOSTIC,
    )
    mlx_layer_split: bool = _setting(
        True,
        "MLX on CUDA: a prompt's chunks beside decoding rows through a few layers a step, so streaming "
        "replies keep their pace (llama, qwen2, qwen3, qwen3.5) (off: a whole forward pass a step)",
        group=DIAGNOSTIC,
    )
    mlx_fuse_projections: bool | None = _setting(
        None, "MLX: q/k/v and gate/up as one matrix product each (auto: on a GPU)", group=DIAGNOSTIC
    )
    mlx_warm_up: bool = _setting(
        True,
        "MLX on CUDA: at load, run every decode row bucket (greedy, sampled, and with long rows' "
        "split attention), one-row prompt chunk shape and the decode step's index ops (penalties, "
        "logprobs, grammar masks, rows in a new order) once (off: each shape costs ~0.2 s the first "
        "time it comes up while serving, each index op's kernel module 3-4 s on a machine whose MLX "
        "PTX cache is empty)",
        group=DIAGNOSTIC,
    )

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


def _kind(f) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def parse_switch(raw: str, *, auto: bool) -> bool | None:
    """An on/off setting: on/off, 1/0, true/false, yes/no (and `auto` -> None where the field allows it)."""
    word = raw.strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    if auto and word == "auto":
        return None
    raise ValueError("use on or off" + (", or auto" if auto else ""))


def _convert(f, raw: str) -> Any:
    kind = _kind(f)
    if "Path" in kind:
        return Path(raw)
    if kind.startswith("bool"):
        return parse_switch(raw, auto="None" in kind)
    if kind.startswith("int"):
        return int(raw)
    if kind.startswith("float"):
        return float(raw)
    return raw


def _metavar(f) -> str | None:
    if f.metadata.get("choices"):
        return None  # argparse shows the choices
    if _kind(f).startswith("bool"):
        return "{auto,on,off}" if "None" in _kind(f) else "{on,off}"
    return f.name.upper()


def _show(f) -> str:
    """A setting's default as the docs and tables write it."""
    if _kind(f).startswith("bool"):
        return {True: "on", False: "off", None: "auto"}[f.default]
    return "" if f.default is MISSING else str(f.default)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting, in a help group per setting group; an unset flag falls through to
    the environment and the default. Diagnostic switches are accepted but left out of `--help`."""
    groups = {
        SERVER: parser.add_argument_group(SERVER),
        ENGINE: parser.add_argument_group(
            ENGINE, "diagnostic switches for the engines are accepted too: docs/configuration.md lists them"
        ),
    }
    for f in fields(Settings):
        group = f.metadata["group"]
        groups.get(group, parser).add_argument(
            _flag(f),
            dest=f"setting_{f.name}",
            # SUPPRESS: an unset flag leaves no attribute, so a subcommand's copy of the flags
            # never hides the same flag given before the subcommand
            default=argparse.SUPPRESS,
            choices=f.metadata.get("choices"),
            metavar=_metavar(f),
            help=argparse.SUPPRESS if group == DIAGNOSTIC else f.metadata["help"],
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


def settings_environ(settings: Settings) -> dict[str, str]:
    """`KINFER_<NAME>` for every setting: how a server that a command starts inherits all of that
    command's settings (through the environment, not argv, so the API key never shows in `ps`)."""
    return {
        f"KINFER_{f.name.upper()}": str(getattr(settings, f.name))
        for f in fields(Settings)
        if getattr(settings, f.name) is not None
    }


def settings_table(group: str | None = None) -> list[tuple[str, str, str, str]]:
    """(flag, env var, default, help) for every setting (of one group, if given), for the docs."""
    return [
        (_flag(f), f"KINFER_{f.name.upper()}", _show(f), f.metadata["help"])
        for f in fields(Settings)
        if group is None or f.metadata["group"] == group
    ]
