"""The gateway never imports torch, so a gateway-only machine needs no model stack
(the import graph's direction itself is held by tests/test_layers.py): checked in a
fresh interpreter, since this test process may have imported torch already."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "sentence_transformers", "transformers")


def heavy_modules_after(*imports: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of the ``heavy`` packages loaded once ``imports`` are imported."""
    probe = (
        "import importlib, json, sys\n"
        f"for name in {list(imports)!r}:\n"
        "    importlib.import_module(name)\n"
        f"heavy = {heavy!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "modules",
    [
        ("gateway.app", "gateway.service", "flotilla.cli"),
        # What `flotilla serve` imports before its worker loads a model.
        ("flotilla.serve", "embedder.host", "embedder.tasks.embed.runtimes"),
    ],
)
def test_gateway_imports_leave_torch_out(modules: tuple[str, ...]) -> None:
    assert heavy_modules_after(*modules) == []


def test_the_probe_sees_torch_when_it_is_imported() -> None:
    """Guards the guard: the same probe reports torch once a runtime module is imported."""
    loaded = heavy_modules_after("gateway.app", "embedder.tasks.embed.runtimes.torch_st")
    assert "torch" in loaded
