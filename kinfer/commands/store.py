"""`kinfer list` / `ls`, `rm`, `show` and `cp`: the model store from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from kinfer.config import Settings
from kinfer.errors import KinferError
from kinfer.store.catalog import Store
from kinfer.store.models import StoredModel

_UNITS = ("KB", "MB", "GB", "TB", "PB")
_AGES = (
    (365 * 86400, "year"),
    (30 * 86400, "month"),
    (7 * 86400, "week"),
    (86400, "day"),
    (3600, "hour"),
    (60, "minute"),
    (1, "second"),
)


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Add the store subcommands; each sets `handler(args, settings) -> int`."""
    ls = sub.add_parser("list", aliases=["ls"], parents=parents, help="list the models in the store")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(handler=run_list)
    rm = sub.add_parser("rm", parents=parents, help="remove models (or aliases) from the store")
    rm.add_argument("names", nargs="+", metavar="NAME", help="model name or unique prefix")
    rm.set_defaults(handler=run_rm)
    show = sub.add_parser("show", parents=parents, help="a model's architecture, size and traits")
    show.add_argument("name", metavar="NAME", help="model name or unique prefix")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=run_show)
    cp = sub.add_parser("cp", parents=parents, help="give a model another name (files are shared)")
    cp.add_argument("source", metavar="SOURCE", help="model name or unique prefix")
    cp.add_argument("alias", metavar="ALIAS", help="the new name")
    cp.set_defaults(handler=run_cp)


def format_size(n: float) -> str:
    """Decimal units, as Ollama prints them: 98 MB, 4.7 GB."""
    if n < 1000:
        return f"{int(n)} B"
    for unit in _UNITS:
        n /= 1000
        if n < 1000 or unit == _UNITS[-1]:
            return f"{n:.1f} {unit}" if n < 10 else f"{round(n)} {unit}"
    raise AssertionError("unreachable")


def format_age(timestamp: float, now: float | None = None) -> str:
    """How long ago, in words: 'just now', '3 minutes ago', '2 weeks ago'."""
    seconds = (time.time() if now is None else now) - timestamp
    if seconds < 1:
        return "just now"
    for span, unit in _AGES:
        if seconds >= span:
            count = int(seconds // span)
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    return "just now"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def _kind(model: StoredModel) -> str:
    return f"alias of {model.alias_of}" if model.alias_of else model.kind_label


def _fail(exc: KinferError) -> int:
    print(f"kinfer: {exc.message}", file=sys.stderr)
    return 1


def _warn(store: Store) -> None:
    for warning in store.warnings:
        print(f"kinfer: warning: {warning}", file=sys.stderr)


def run_list(args: argparse.Namespace, settings: Settings) -> int:
    store = Store.from_settings(settings)
    models = store.list()
    _warn(store)
    if args.json:
        data = [
            {**m.to_dict(), "modified_at": datetime.fromtimestamp(m.modified, UTC).isoformat()}
            for m in models
        ]
        print(json.dumps(data, indent=2))
        return 0
    rows = [["NAME", "KIND", "SIZE", "MODIFIED"]]
    rows += [[m.name, _kind(m), format_size(m.size), format_age(m.modified)] for m in models]
    print(_table(rows))
    return 0


def run_rm(args: argparse.Namespace, settings: Settings) -> int:
    store = Store.from_settings(settings)
    status = 0
    for name in args.names:
        try:
            model = store.remove(name)
        except KinferError as exc:
            status = _fail(exc)
            continue
        print(f"removed alias {model.name}" if model.is_alias else f"removed {model.name}")
    return status


TOOL_FORMAT_LABELS = {
    "hermes": "hermes (JSON in <tool_call>)",
    "qwen3_5_xml": "qwen3_5_xml (XML in <tool_call>)",
    "default": "default (the template has none: kinfer adds a Hermes tool prompt)",
    "none": "none (the template's own convention, which kinfer cannot parse)",
}


def _details_lines(details: dict[str, Any], model: StoredModel) -> list[str]:
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    fields = [
        ("name", details["name"]),
        ("alias of", details["alias_of"]),
        ("kind", _kind(model)),
        ("engine", details["engine"]),
        ("architecture", details["architecture"]),
        ("parameters", details["parameter_label"]),
        ("quantization", details["quantization"]),
        ("context length", details["context_length"]),
        ("embedding length", details["embedding_length"]),
        ("layers", details["block_count"]),
        ("capabilities", ", ".join(details["capabilities"])),
        ("pooling", details["pooling"]),
        ("chat template", yes(details["has_chat_template"])),
        ("thinking", yes(details["thinking"])),
        ("tool calls", TOOL_FORMAT_LABELS.get(details["tool_format"], details["tool_format"])),
        ("size", format_size(details["size"])),
        ("path", str(model.path)),
    ]
    if model.manifest is not None and model.manifest.source:
        fields.append(("source", model.manifest.source))
    lines = ["  Model"]
    lines += [f"    {label:<18}{value}" for label, value in fields if value not in (None, "")]
    lines.append("")
    lines.append("  Files")
    width = max((len(f["path"]) for f in details["files"]), default=0)
    lines += [f"    {f['path']:<{width}}   {format_size(f['size'])}" for f in details["files"]]
    return lines


def run_show(args: argparse.Namespace, settings: Settings) -> int:
    from kinfer.store.inspect import describe

    store = Store.from_settings(settings)
    try:
        model = store.resolve(args.name)
        details = describe(model)
    except KinferError as exc:
        return _fail(exc)
    data = details.to_dict()
    if args.json:
        print(json.dumps({**data, "path": str(model.path)}, indent=2))
        return 0
    print("\n".join(_details_lines(data, model)))
    return 0


def run_cp(args: argparse.Namespace, settings: Settings) -> int:
    store = Store.from_settings(settings)
    try:
        alias = store.copy(args.source, args.alias)
    except KinferError as exc:
        return _fail(exc)
    print(f"copied {alias.alias_of} to {alias.name}")
    return 0
