"""No function of the product or the benchmarks runs past what one reads at once: ruff
bounds their branches and statements (pyproject's C901, PLR0912, PLR0915); this bounds
their lines, which those rules do not count (a long call or literal is one statement)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("embedder", "gateway", "ingest", "lora", "flotilla", "bench")
MAX_LINES = 80


def long_functions(max_lines: int = MAX_LINES) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > max_lines:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines}")
    return found


def test_no_function_is_over_the_bound() -> None:
    assert long_functions() == []


def test_the_bound_finds_a_long_function() -> None:
    assert long_functions(max_lines=20) != []  # the scan reads the tree (not vacuous)
