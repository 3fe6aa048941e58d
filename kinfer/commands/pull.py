"""`kinfer pull REF` and `kinfer can-run REF`: models from the Hugging Face Hub.

Errors are one line on stderr and exit status 1. `can-run` prices the context and rows given by the
shared `--ctx` / `--parallel` flags (defaults: 4096 tokens x 4 rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

from kinfer.config import Settings
from kinfer.errors import InvalidRequest, KinferError
from kinfer.store.can_run import DEFAULT_CTX, DEFAULT_PARALLEL, can_run, format_report
from kinfer.store.catalog import Store
from kinfer.store.progress import ProgressPrinter, format_bytes
from kinfer.store.pull import pull

REF_HELP = "owner/repo, owner/repo:QUANT, hf.co/owner/repo[:QUANT] or a URL to one .gguf file"


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Add `pull` and `can-run`; each sets `handler(args, settings) -> int`."""
    p = sub.add_parser("pull", parents=parents, help="download a model from the Hugging Face Hub")
    p.add_argument("ref", metavar="REF", help=REF_HELP)
    p.set_defaults(handler=run_pull)
    c = sub.add_parser(
        "can-run",
        parents=parents,
        help="will a model fit this machine? (downloads no weights)",
        description="Estimate the memory each variant of a model needs for --ctx tokens x --parallel rows "
        f"(defaults {DEFAULT_CTX} x {DEFAULT_PARALLEL}) and compare it with this machine's.",
    )
    c.add_argument("ref", metavar="REF", help=REF_HELP)
    c.add_argument("--json", action="store_true", help="print JSON")
    c.add_argument(
        "--hosts", type=int, default=1, help="split across this many hosts (kinfer --distributed): per host"
    )
    c.set_defaults(handler=run_can_run)


def _fail(exc: KinferError) -> int:
    print(f"kinfer: {exc.message}", file=sys.stderr)
    return 1


def run_pull(args: argparse.Namespace, settings: Settings) -> int:
    store = Store.from_settings(settings)
    cancel = threading.Event()
    try:
        model = pull(store, args.ref, on_progress=ProgressPrinter(sys.stderr), cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        print("kinfer: pull interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except KinferError as exc:
        return _fail(exc)
    except OSError as exc:  # the store's disk or folders: one line, never a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"kinfer: pull failed: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    print(f"pulled {model.name} ({format_bytes(model.size)}, {model.kind_label})")
    return 0


def run_can_run(args: argparse.Namespace, settings: Settings) -> int:
    ctx = settings.ctx or DEFAULT_CTX
    parallel = settings.parallel or DEFAULT_PARALLEL
    try:
        if args.hosts < 1:
            raise InvalidRequest("--hosts is 1 or more")
        report = can_run(args.ref, ctx=ctx, parallel=parallel, hosts=args.hosts)
    except KinferError as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 0
