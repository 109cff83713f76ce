"""The import rules of docs/architecture.md ("Layers and the rules between them"),
checked on the source: each top-level module of ``pycrid`` sits in one layer and imports
only its own layer or those below; no two packages import each other, directly or
round a longer loop; no source module grows past 400 lines."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "pycrid"

# Lowest first. A unit is a subpackage or a top-level module of pycrid.
LAYERS: dict[str, set[str]] = {
    "base": {"__init__", "errors", "faults", "operations", "log", "tasks", "stdio", "inotify",
             "unixsock", "pathlock", "sdnotify", "cri_fields", "host", "plugin", "release",
             "config"},
    "parts": {"store", "images", "oci", "runtime", "sandbox", "network", "nri", "stats",
              "events"},
    "core": {"core"},
    "edges": {"cri", "cadvisor", "metrics", "streaming", "tracing"},
    "wiring": {"builtins", "core_wiring", "daemon", "cli", "__main__", "bench", "install",
               "preflight", "status_command", "endpoints"},
}
RANK = {unit: rank for rank, units in enumerate(LAYERS.values()) for unit in units}
MAX_LINES = 400
GENERATED = ("nri/proto/", "cadvisor/proto/")


def _unit(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _module(path: Path) -> list[str]:
    parts = ["pycrid", *path.relative_to(SRC).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imported_units(path: Path) -> set[str]:
    """The pycrid units ``path`` imports, at any depth (lazy imports count too)."""
    here = _module(path)
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        for name in names:
            bits = name.split(".")
            if bits[0] == "pycrid" and len(bits) > 1:
                target = bits[1]
                if target in RANK or (SRC / target).is_dir() or (SRC / f"{target}.py").exists():
                    found.add(target)
    return found


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py")
                  if not any(g in p.relative_to(SRC).as_posix() for g in GENERATED))


def _graph() -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> the modules that import it."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in _sources():
        unit = _unit(path)
        for target in _imported_units(path) - {unit}:
            graph.setdefault(unit, {}).setdefault(target, set()).add(
                path.relative_to(SRC).as_posix())
    return graph


def test_every_unit_has_a_layer() -> None:
    units = {_unit(p) for p in _sources()}
    assert units - RANK.keys() == set(), "put new modules in a layer of LAYERS"


def test_no_unit_imports_a_higher_layer() -> None:
    wrong = [f"{src} ({', '.join(sorted(mods))}) imports {dst}"
             for unit, targets in _graph().items() for dst, mods in targets.items()
             for src in [unit] if RANK[dst] > RANK[src]]
    assert wrong == []


def test_no_cycle_between_packages() -> None:
    graph = {u: set(t) for u, t in _graph().items()}
    reach: dict[str, set[str]] = {}

    def reachable(unit: str) -> set[str]:
        if unit not in reach:
            reach[unit] = set()
            seen, todo = set(), list(graph.get(unit, ()))
            while todo:
                nxt = todo.pop()
                if nxt not in seen:
                    seen.add(nxt)
                    todo.extend(graph.get(nxt, ()))
            reach[unit] = seen
        return reach[unit]

    loops = sorted({tuple(sorted((a, b))) for a, b in itertools.permutations(graph, 2)
                    if b in reachable(a) and a in reachable(b)})
    assert loops == []


def test_no_source_module_over_the_limit() -> None:
    long = {p.relative_to(SRC).as_posix(): n for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


MAX_PARAMS = 8


def test_no_function_takes_more_than_eight_parameters() -> None:
    """Counting every parameter but ``self``/``cls``: more than eight means a group of
    them wants to be one typed object."""
    wide = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs,
                          *filter(None, [a.vararg, a.kwarg])]
                if params and params[0].arg in ("self", "cls"):
                    params = params[1:]
                if len(params) > MAX_PARAMS:
                    wide.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} "
                                f"({len(params)})")
    assert wide == []
