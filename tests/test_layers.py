"""The import graph runs one way: gateway -> embedder's vocabulary <- worker -> runtimes,
ingest and lora beside the gateway, the commands (flotilla) and benchmarks on top.

Checked twice: statically, every import statement anywhere in a module (function
bodies and ``TYPE_CHECKING`` blocks included, so a lazy import cannot hide an upward
arrow), and at run time, by importing every module of a package in a fresh
interpreter where the packages above it cannot be imported at all.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> the packages it may import (besides itself and third-party libraries)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "embedder": frozenset(),
    "ingest": frozenset({"embedder"}),
    "gateway": frozenset({"embedder", "ingest"}),
    "lora": frozenset({"embedder", "ingest"}),
    "flotilla": frozenset({"embedder", "ingest", "gateway", "lora"}),
    "bench": frozenset({"embedder", "ingest", "gateway", "lora", "flotilla", "tests"}),
}
# The worker side of embedder: the gateway reaches it only through the queue.
WORKER_SIDE = ("embedder.tasks.embed.worker", "embedder.host", "embedder.tasks.embed.execute", "embedder.tasks.embed.runtimes")
# The HTTP side: runtimes and the worker never import a web framework.
WEB = ("fastapi", "starlette", "uvicorn", "gateway")


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in MAY_IMPORT:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name an import statement in the module names: ``from a import b``
    gives ``a.b`` when that is a module, else ``a`` (a name defined in ``a``). Importing a
    submodule also runs its package's ``__init__``, as every module's import does: that
    implicit step is not an arrow."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                name = f"{source}.{alias.name}"
                yield name if name in MODULES else source


def internal(name: str) -> str | None:
    """The project module a dotted name lives in, if any."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets = {internal(name) for name in imported_names(module, path)}
        edges[module] = {t for t in targets if t is not None and t != module}
    return edges


def test_no_package_imports_one_above_it() -> None:
    upward = [
        f"{module} imports {name}"
        for module, path in MODULES.items()
        for name in set(imported_names(module, path))
        if (top := name.split(".")[0]) in {*MAY_IMPORT, "tests"}
        and top != module.split(".")[0]
        and top not in MAY_IMPORT[module.split(".")[0]]
    ]
    assert upward == []


def test_the_gateway_never_imports_the_worker_side() -> None:
    reaching = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        if module.startswith("gateway")
        for target in targets
        if target.startswith(WORKER_SIDE)
    ]
    assert reaching == []


def test_runtimes_and_the_worker_never_import_the_web_side() -> None:
    reaching = [
        f"{module} imports {name}"
        for module, path in MODULES.items()
        if module.startswith(WORKER_SIDE)
        for name in set(imported_names(module, path))
        if name.split(".")[0] in WEB
    ]
    assert reaching == []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# Everything above a package, blocked while that package's modules are imported.
BLOCK_PROBE = """
import importlib, importlib.abc, json, pkgutil, sys
blocked, package = set(json.loads(sys.argv[1])), sys.argv[2]

class Above(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is above {package}")
        return None

sys.meta_path.insert(0, Above())
failed = {}
root = importlib.import_module(package)
for info in pkgutil.walk_packages(root.__path__, package + "."):
    try:
        importlib.import_module(info.name)
    except ImportError as exc:
        failed[info.name] = str(exc)
print(json.dumps(failed))
"""


def failed_imports(package: str, blocked: list[str], cwd: Path) -> dict[str, str]:
    """The modules of ``package`` that cannot be imported while ``blocked`` cannot."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_PROBE, json.dumps(blocked), package],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    failed: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return failed


@pytest.mark.parametrize("package", ["embedder", "ingest", "gateway", "lora"])
def test_each_package_imports_with_the_packages_above_it_blocked(package: str) -> None:
    above = sorted({*MAY_IMPORT, "tests"} - MAY_IMPORT[package] - {package})
    assert failed_imports(package, above, ROOT) == {}


def test_the_blocking_probe_catches_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "low").mkdir()
    (tmp_path / "low" / "__init__.py").write_text("")
    (tmp_path / "low" / "leak.py").write_text("import high\n")
    (tmp_path / "high.py").write_text("")
    assert list(failed_imports("low", ["high"], tmp_path)) == ["low.leak"]


def test_every_package_is_checked() -> None:
    tops = {info.name for info in pkgutil.iter_modules([str(ROOT)]) if info.ispkg}
    assert tops - {"tests", "build", "dist"} - {p for p in tops if p.endswith("egg-info")} == set(
        MAY_IMPORT
    )
