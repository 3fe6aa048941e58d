"""`kinfer bench`: concurrency sweeps and the prefix scenario, against kinfer or OpenAI-style peers.

kinfer bench --model smollm2:135m --concurrency 1,4,16 --max-tokens 64     start kinfer, sweep
kinfer bench --url http://127.0.0.1:11500 --dialect ollama                 a running server
kinfer bench --peer kinfer --peer llama-cpp-server --weights model.gguf    servers side by side
kinfer bench --scenario prefix --system-tokens 9000                        cold vs reused prompt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
import tempfile
from pathlib import Path

from kinfer.config import Settings

log = logging.getLogger(__name__)


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be numbers >= 1")
    return levels


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    from kinfer.bench.clients import DIALECTS
    from kinfer.bench.servers import SERVER_KINDS

    p = sub.add_parser(
        "bench",
        parents=parents,
        help="benchmark a server: concurrency sweep or the prefix scenario",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_argument_group("what to measure (default: start kinfer on --model, or the store's default)")
    where.add_argument("--url", help="a running server (kinfer or any OpenAI-compatible one)")
    where.add_argument("--pid", type=int, help="the running server's PID, to report its memory (RSS)")
    where.add_argument(
        "--peer",
        action="append",
        choices=SERVER_KINDS,
        help="start this server on --weights and measure it (repeat to compare, one after another)",
    )
    where.add_argument("--weights", type=Path, help="GGUF file or HF model folder for --peer servers")
    where.add_argument("--label", help="name of the target in tables (with --url)")
    what = p.add_argument_group("load")
    what.add_argument("--scenario", choices=("sweep", "prefix"), default="sweep")
    what.add_argument("--dialect", choices=DIALECTS, default="openai")
    what.add_argument("--concurrency", type=_levels, default=(1, 4, 16, 64), help="levels, e.g. 1,4,16,64")
    what.add_argument("--prompt-tokens", type=_positive, default=128, help="prompt size per request")
    what.add_argument(
        "--max-tokens", type=_positive, help="tokens generated per request (sweep: 128, prefix: 32)"
    )
    what.add_argument(
        "--requests-per-level",
        type=_positive,
        help="requests per level (default and minimum: the level's concurrency)",
    )
    what.add_argument("--system-tokens", type=_positive, default=9000, help="prefix scenario: system prompt")
    what.add_argument("--turn-tokens", type=_positive, default=48, help="prefix scenario: each user message")
    what.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="let replies end early (by default generation runs to --max-tokens)",
    )
    what.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    out = p.add_argument_group("output")
    out.add_argument("--json", type=Path, dest="json_path", metavar="FILE", help="write the results as JSON")
    out.add_argument("--markdown", action="store_true", help="print markdown tables")
    out.add_argument("--logs", type=Path, help="folder for the started servers' logs (default: a temp dir)")
    p.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace, settings: Settings) -> int:
    from kinfer.bench import report

    # one line per request and per memory sample would bury the progress lines
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.url and args.peer:
        print("kinfer bench: give --url or --peer, not both", file=sys.stderr)
        return 2
    if args.peer and any(kind != "kinfer" for kind in args.peer) and args.weights is None:
        print("kinfer bench: llama-cpp-server and mlx-lm-server need --weights PATH", file=sys.stderr)
        return 2
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="kinfer-bench-logs-"))
    runs = []
    try:
        if args.url:
            runs.append(_measure(args, _url_target(args, settings)))
        else:
            for kind in args.peer or ["kinfer"]:
                with _start(kind, args, settings, log_dir) as server:
                    runs.append(_measure(args, server.target))
    except RuntimeError as exc:
        print(f"kinfer bench: {exc}", file=sys.stderr)
        return 1
    _print_runs(runs, markdown=args.markdown)
    if args.json_path:
        command = command_line(args, settings)
        args.json_path.write_text(json.dumps(report.report_json(runs, command=command), indent=2) + "\n")
        print(f"wrote {args.json_path}", file=sys.stderr)
    failed = any(level.ok == 0 for run in runs for level in getattr(run, "levels", ()))
    return 1 if failed else 0


def command_line(args: argparse.Namespace, settings: Settings) -> str:
    """The run's settings as one canonical `kinfer bench ...` line (for the JSON and the docs)."""
    parts = ["kinfer", "bench"]
    for flag, value in (
        ("--url", args.url),
        ("--model", settings.model),
        ("--weights", args.weights),
        ("--parallel", settings.parallel or None),
        ("--ctx", settings.ctx or None),
        ("--threads", settings.threads or None),
        ("--scenario", args.scenario),
        ("--dialect", args.dialect),
    ):
        if value is not None:
            parts += [flag, str(value)]
    for kind in args.peer or ():
        parts += ["--peer", kind]
    if args.scenario == "prefix":
        parts += ["--system-tokens", str(args.system_tokens), "--turn-tokens", str(args.turn_tokens)]
    else:
        parts += ["--concurrency", ",".join(map(str, args.concurrency))]
        parts += ["--prompt-tokens", str(args.prompt_tokens)]
        if args.requests_per_level:
            parts += ["--requests-per-level", str(args.requests_per_level)]
    parts += ["--max-tokens", str(_max_tokens(args))]
    if args.no_ignore_eos:
        parts.append("--no-ignore-eos")
    return shlex.join(parts)


def _url_target(args: argparse.Namespace, settings: Settings):
    from kinfer.bench.clients import Target

    extra = {} if args.no_ignore_eos or args.dialect == "ollama" else {"ignore_eos": True}
    return Target(
        label=args.label or args.url,
        url=args.url.rstrip("/"),
        dialect=args.dialect,
        model=settings.model,
        extra_body=extra,
        api_key=settings.api_key,
        pid=args.pid,
    )


def _context_for(args: argparse.Namespace) -> int:
    """Tokens one row must hold for this run."""
    if args.scenario == "prefix":
        return _prefix_config(args).context_needed()
    # the prompt estimate can be off by a few percent before calibration; leave room
    return int(args.prompt_tokens * 1.25) + _max_tokens(args) + 256


def _max_tokens(args: argparse.Namespace) -> int:
    from kinfer.bench.prefix import DEFAULT_PREFIX_MAX_TOKENS
    from kinfer.bench.sweep import DEFAULT_MAX_TOKENS

    if args.max_tokens:
        return args.max_tokens
    return DEFAULT_PREFIX_MAX_TOKENS if args.scenario == "prefix" else DEFAULT_MAX_TOKENS


def _start(kind: str, args: argparse.Namespace, settings: Settings, log_dir: Path):
    from kinfer.bench import servers
    from kinfer.engines.llama.sizing import available_threads

    threads = settings.threads or available_threads()
    rows = settings.parallel or (1 if args.scenario == "prefix" else max(args.concurrency))
    if kind == "kinfer":
        engine = "" if args.weights is None else (" mlx" if args.weights.is_dir() else " llama.cpp")
        # --ctx unset: automatic, unless the prefix scenario needs more than the automatic 4096
        ctx = settings.ctx or (_context_for(args) if args.scenario == "prefix" else 0)
        server = servers.start_kinfer(
            model=None if args.weights else settings.model,
            weights=args.weights,
            home=None if args.weights else settings.home,
            parallel=rows,
            ctx=ctx,
            threads=settings.threads,
            dialect=args.dialect,
            label=f"kinfer{engine}",
            log_dir=log_dir,
        )
    elif kind == "llama-cpp-server":
        server = servers.start_llama_cpp_server(
            args.weights, ctx=settings.ctx or _context_for(args), threads=threads, log_dir=log_dir
        )
    else:
        server = servers.start_mlx_lm_server(args.weights, concurrency=rows, log_dir=log_dir)
    if args.no_ignore_eos:
        from dataclasses import replace

        server.target = replace(server.target, extra_body={})
    if kind != "kinfer" and args.dialect != "openai":
        print(f"note: {kind} speaks only the OpenAI dialect; using it", file=sys.stderr)
    return server


def _prefix_config(args: argparse.Namespace):
    from kinfer.bench.prefix import PrefixConfig

    return PrefixConfig(
        system_tokens=args.system_tokens,
        turn_tokens=args.turn_tokens,
        max_tokens=_max_tokens(args),
        timeout_s=args.timeout,
    )


def _measure(args: argparse.Namespace, target):
    from kinfer.bench import report
    from kinfer.bench.prefix import run_prefix
    from kinfer.bench.sweep import SweepConfig, run_sweep

    print(f"benchmarking {report.target_title(target)}", file=sys.stderr)
    if args.scenario == "prefix":
        return asyncio.run(run_prefix(target, _prefix_config(args)))
    config = SweepConfig(
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens,
        max_tokens=_max_tokens(args),
        requests_per_level=args.requests_per_level,
        timeout_s=args.timeout,
    )

    def progress(level) -> None:
        print(
            f"  concurrency {level.concurrency}: {level.aggregate_tps:.1f} tok/s aggregate, "
            f"{level.errors} errors",
            file=sys.stderr,
        )

    return asyncio.run(run_sweep(target, config, on_level=progress))


def _print_runs(runs: list, *, markdown: bool) -> None:
    from kinfer.bench import report
    from kinfer.bench.sweep import SweepRun

    print(f"machine: {report.machine_line()}")
    sweeps = [run for run in runs if isinstance(run, SweepRun)]
    for run in runs:
        print()
        if isinstance(run, SweepRun):
            print(report.sweep_table(run, markdown=markdown))
        else:
            print(report.prefix_table(run, markdown=markdown))
    if len(sweeps) > 1:
        print()
        print(report.comparison_table(sweeps, markdown=markdown))
    if sweeps:
        print()
        print(report.plot(sweeps))
