"""Layers only point down (STYLE.md): no import cycle among src/phase6's modules, and config/ imports nothing else of
phase6. Read from the source with ``ast`` (nothing is imported): every ``import`` / ``from ... import`` anywhere in a
file counts, including those inside functions and under ``TYPE_CHECKING`` -- a lazy import hides a cycle from the
interpreter, not from the reader."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Cycles tolerated for now (none: fleet/run <-> fleet/compare went with fleet/setup.py). An entry here must still be a
# cycle: the test below fails once it is gone, so the list only shrinks.
KNOWN_CYCLES: list[set[str]] = []
"""Cycles that exist and are being removed elsewhere; any other cycle fails."""


def module_files() -> dict[str, Path]:
    """{dotted module name: file} of every module under src/phase6 (a package is its __init__.py)."""
    out: dict[str, Path] = {}
    for path in sorted((SRC / "phase6").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """{module: the phase6 modules it imports}; ``from pkg import name`` counts as importing ``pkg.name`` when that
    is a module, else ``pkg``."""
    files = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: up (level - 1) packages from this module's package
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets += [f"{base}.{alias.name}" for alias in node.names]
        graph[mod] = {t for t in map(resolve, (t for t in targets if t.split(".")[0] == "phase6")) if t and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.add(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def test_the_graph_sees_known_imports() -> None:
    """The walker itself: absolute, from-package and lazy (in-function) imports are all edges."""
    graph = import_graph()
    assert "phase6.config.pretrain" in graph["phase6.parallel"]  # module level
    assert "phase6.fleet.papers" in graph["phase6.fleet.run"]  # inside a function
    assert "phase6.serving.tp_server.args" in graph["phase6.serving.tp_server"]  # a package's __init__
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    unexpected = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not unexpected, f"import cycles in src/phase6 (layers must only point down): {unexpected}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"{gone} is no longer a cycle: remove it from KNOWN_CYCLES in tests/test_imports.py"


@pytest.mark.parametrize("module", sorted(m for m in module_files() if m.startswith("phase6.config")))
def test_config_is_a_leaf(module: str) -> None:
    """config/ may import config/ and nothing else of phase6 (third-party: omegaconf and the standard library)."""
    outside = sorted(t for t in import_graph()[module] if not t.startswith("phase6.config"))
    assert not outside, f"{module} imports {outside}: config/ must not import the rest of phase6"


@pytest.mark.parametrize("module", sorted(m for m in module_files() if m.startswith("phase6.serving")))
def test_serving_never_imports_the_fleet(module: str) -> None:
    """serving/ is the library under the fleet job: the trace parsers, SLO and percentile it shares live there."""
    up = sorted(t for t in import_graph()[module] if t.startswith("phase6.fleet"))
    assert not up, f"{module} imports {up}: serving/ must not import fleet/"


def test_the_fleet_loads_without_torch() -> None:
    """fleet/compare.py reads the torch-tp server's defaults from its torch-free args module, not the engine."""
    code = "import sys, phase6.fleet.compare, phase6.fleet.run; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
