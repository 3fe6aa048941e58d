"""`kinfer` command line: the dashboard by default, `--headless` for a bare server, and subcommands.

Each subcommand lives in `kinfer/commands/<name>.py` with a `register(subparsers, parents)` function
that adds its parser and sets `handler(args, settings) -> int`. Modules are imported here only,
so `kinfer list` never imports an engine or Textual.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from kinfer import __version__
from kinfer.config import Settings, add_server_arguments, load_settings

COMMAND_MODULES = ("store", "pull", "serve", "bench")


def build_parser() -> argparse.ArgumentParser:
    settings_flags = argparse.ArgumentParser(add_help=False)
    add_server_arguments(settings_flags)
    parser = argparse.ArgumentParser(
        prog="kinfer",
        description="A local LLM server: four API dialects on one port, a model store, a live dashboard.",
        parents=[settings_flags],
    )
    parser.add_argument("--version", action="version", version=f"kinfer {__version__}")
    parser.add_argument("--headless", action="store_true", help="serve without the dashboard")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"kinfer.commands.{name}")
        module.register(sub, [settings_flags])
    return parser


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = load_settings(args)
    configure_logging(settings)
    handler = getattr(args, "handler", None)
    if handler is None:
        from kinfer.commands.serve import serve

        return serve(settings, headless=args.headless)
    try:
        return int(handler(args, settings) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
