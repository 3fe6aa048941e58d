"""The kinfer package's import graph: no cycles, and no dialect reaching into another.

Read from the source (AST), so every import counts: module-level, inside functions, and under
`if TYPE_CHECKING:`. A cycle hidden in a function is still a layering mistake (runtime.py once
imported server.app lazily while server.app imported runtime), so hiding an import does not pass.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import kinfer
from kinfer.server.dialects import DIALECTS

PACKAGE_DIR = Path(kinfer.__file__).parent
SERVER = "kinfer.server"


@dataclass(frozen=True)
class SourceModule:
    name: str  # dotted, e.g. "kinfer.server.app"
    path: Path
    is_package: bool


@cache
def modules() -> dict[str, SourceModule]:
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = SourceModule(".".join(parts), path, is_package)
    return found


def imported_names(module: SourceModule) -> set[str]:
    """Every dotted name `module` imports anywhere in its body, relative imports resolved."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.path.read_text(), str(module.path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # `from kinfer.server import ollama` imports the module kinfer.server.ollama
            names.update(f"{source}.{alias.name}" for alias in node.names)
            names.add(source)
    return names


def kinfer_module(name: str) -> str | None:
    """The kinfer module a dotted name lands in (`kinfer.scheduler.Scheduler` -> `kinfer.scheduler`)."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """module -> the kinfer modules importing it runs, including the packages' __init__ on the way.

    Importing `kinfer.chat.template` from outside `kinfer.chat` first runs `kinfer/chat/__init__.py`, so
    that counts as an import of `kinfer.chat`; from inside the package it is already running.
    """
    graph = {}
    for name, module in modules().items():
        targets: set[str] = set()
        for imported in imported_names(module):
            target = kinfer_module(imported)
            if target is None:
                continue
            targets.add(target)
            parent = target.rpartition(".")[0]
            while parent:
                if not (name == parent or name.startswith(parent + ".")):
                    targets.add(parent)
                parent = parent.rpartition(".")[0]
        targets.discard(name)
        graph[name] = frozenset(targets)
    return graph


def find_cycle(graph: dict[str, frozenset[str]]) -> list[str] | None:
    """One import cycle as a path (`a -> b -> a`), or None. Depth-first, colouring nodes."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph[node]):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done and (cycle := visit(target)):
                return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done and (cycle := visit(node)):
            return cycle
    return None


def dialect_of(module: str) -> str | None:
    """The dialect a kinfer.server module belongs to: `<name>.py` and `<name>_*.py` (wire, render,
    store, ...) are dialect <name>'s; the rest (app, wire, streaming, context, ...) are shared."""
    package, _, stem = module.rpartition(".")
    if package != SERVER:
        return None
    for dialect in DIALECTS:
        if stem == dialect.name or stem.startswith(dialect.name + "_"):
            return dialect.name
    return None


# ---- the tests --------------------------------------------------------------------------------


def test_the_walk_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert len(graph) > 100
    assert "kinfer.runtime" in graph["kinfer.server.app"]  # module level
    assert "kinfer.tui.app" in graph["kinfer.commands.serve"]  # inside a function
    assert "kinfer.runtime" in graph["kinfer.server.context"]  # under `if TYPE_CHECKING:`
    assert "kinfer.scheduler" in graph["kinfer.server.openai_chat"]  # a package's __init__, named
    assert "kinfer.engines" in graph["kinfer.runtime"]  # ... and run on the way to kinfer.engines.loader
    assert "kinfer.server" not in graph["kinfer.server.app"]  # (already running for its own modules)


def test_a_cycle_is_reported_as_its_path() -> None:
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": frozenset({"b"}), "b": frozenset()}) is None


def test_no_import_cycle_among_kinfer_modules() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_composition_root_never_imports_the_server() -> None:
    # layers point one way: server -> runtime -> scheduler, store
    reached = {target for target in import_graph()["kinfer.runtime"] if target.startswith(SERVER)}
    assert reached == set()


def test_every_dialect_module_is_checked() -> None:
    by_dialect: dict[str, set[str]] = {}
    for name in modules():
        if (dialect := dialect_of(name)) is not None:
            by_dialect.setdefault(dialect, set()).add(name.rpartition(".")[2])
    assert by_dialect == {
        "openai": {"openai_chat", "openai_wire", "openai_embeddings"},
        "ollama": {"ollama", "ollama_wire", "ollama_embed"},
        "anthropic": {"anthropic", "anthropic_wire"},
        "responses": {
            "responses",
            "responses_wire",
            "responses_render",
            "responses_store",
            "responses_tools",
            "responses_items",
        },
    }
    for dialect in DIALECTS:  # each blueprint lives in its own dialect's module
        assert dialect_of(dialect.blueprint.import_name) == dialect.name


def test_no_dialect_imports_another_dialects_modules() -> None:
    crossings = []
    for name, targets in import_graph().items():
        own = dialect_of(name)
        if own is None:
            continue
        crossings += [f"{name} -> {t}" for t in sorted(targets) if dialect_of(t) not in (None, own)]
    assert crossings == []
