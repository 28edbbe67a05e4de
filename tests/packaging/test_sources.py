"""What an installed flotilla runs must not reach into the checkout: no module of the
packages imports the test suite (the wheel does not carry it), not even lazily inside a
function, which importing the modules would not show."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("flotilla", "embedder", "gateway", "ingest", "lora", "bench")


def imported_names(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            names += [a.value for a in node.args if isinstance(a, ast.Constant)]
    return [str(name) for name in names]


def test_no_module_of_the_packages_imports_the_tests() -> None:
    sources = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    assert len(sources) > 100
    offending = {
        str(path.relative_to(REPO)): name
        for path in sources
        for name in imported_names(ast.parse(path.read_text(encoding="utf-8")))
        if name.split(".")[0] == "tests"
    }
    assert offending == {}


def test_the_check_sees_an_import_inside_a_function() -> None:
    code = "def f():\n    from tests.fakes import x\n    importlib.import_module('tests.y')\n"
    assert imported_names(ast.parse(code)) == ["tests.fakes", "tests.y"]
