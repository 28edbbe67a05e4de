"""The export cache: built once per content, reused after, rebuilt when the weights change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from embedder.tasks.embed.runtimes import export as export_module
from embedder.tasks.embed.runtimes import load_runtime
from embedder.tasks.embed.runtimes.export import STAMP_FILE, exports_dir, folder_digest, onnx_export
from tests.embedder.tasks.embed.runtimes.conftest import TEXTS, spec_for, worst_cosine
from tests.tiny_models import build_tiny_embedder


def test_a_second_load_reuses_the_export(
    tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = onnx_export(spec_for(tiny_embedder, "onnx"))
    assert (first.folder / STAMP_FILE).is_file() and first.folder.parent == exports_dir()

    def no_export(*args: object) -> dict[str, object]:
        raise AssertionError("exported again")

    monkeypatch.setattr(export_module, "_export", no_export)
    again = onnx_export(spec_for(tiny_embedder, "onnx"))
    assert (again.folder, again.built, again.meta) == (first.folder, False, first.meta)
    for runtime in ("onnx", "openvino"):  # neither runtime exports again either
        load_runtime(spec_for(tiny_embedder, runtime), "cpu", 1)


def test_changed_weights_build_a_new_export(tmp_path: Path) -> None:
    folder = build_tiny_embedder(tmp_path / "a", seed=1)
    old = onnx_export(spec_for(folder, "onnx"))
    shutil.rmtree(folder)
    shutil.copytree(build_tiny_embedder(tmp_path / "b", seed=2), folder)
    new = onnx_export(spec_for(folder, "onnx"))
    assert new.built and new.folder != old.folder
    graph = load_runtime(spec_for(folder, "onnx"), "cpu", 1)
    ref = load_runtime(spec_for(folder, "torch"), "cpu", 1)
    encoded = ref.tokenize(TEXTS, "right")
    assert worst_cosine(graph.forward(encoded), ref.forward(encoded)) >= 0.9999


def test_options_and_libraries_are_part_of_the_key(
    tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mean = onnx_export(spec_for(tiny_embedder, "onnx"))
    assert onnx_export(spec_for(tiny_embedder, "onnx", pooling="cls")).folder != mean.folder
    versions = export_module.library_versions
    monkeypatch.setattr(
        export_module,
        "library_versions",
        lambda *names: {**versions(*names), "torch": "0.0-other"},
    )
    assert onnx_export(spec_for(tiny_embedder, "onnx")).folder != mean.folder


def test_the_digest_covers_every_model_file_but_hidden_ones(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "config.json").write_text("{}")
    before = folder_digest(tmp_path)
    (tmp_path / ".lock").write_text("x")
    assert folder_digest(tmp_path) == before
    (tmp_path / "sub" / "config.json").write_text('{"a": 1}')
    assert folder_digest(tmp_path) != before
