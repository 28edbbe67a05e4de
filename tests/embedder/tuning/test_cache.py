"""This machine's tuned profiles: the cache file's keys (fingerprint, weights digest,
library versions), what makes an entry stale, and profiles borrowed from the same CPU
with another core count, their threads scaled."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedder.tasks.embed.runtimes.export import folder_digest
from embedder.tuned import Measured, TunedEntry, TunedProfiles
from embedder.tuning import cache
from embedder.tuning.cache import (
    Identity,
    borrow,
    lookup,
    read_cache,
    record,
    scale_threads,
    split_cores,
    weights_digest,
)

HERE = "cpu:intel-xeon:amx_bf16+avx2:2c"
LIBS = {"torch": "2.9.0", "onnxruntime": "1.31.0", "openvino": "absent"}


def entry(
    threads: int = 2, runtime: str = "onnx", runner_up_threads: int | None = None
) -> TunedEntry:
    up = None if runner_up_threads is None else {"runtime": "torch", "threads": runner_up_threads}
    return TunedEntry(
        profile={"runtime": runtime, "dtype": "float32", "threads": threads},
        measured=Measured(tokens_per_s=1000.0, worst_cosine=0.9999, runner_up=up),
    )


def test_a_recorded_entry_is_found_while_its_weights_and_libraries_are_unchanged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tuned" / "profiles.yaml"
    identity = Identity("w1", LIBS)
    record(path, "m", HERE, entry(), identity)
    record(path, "other", HERE, entry(threads=1), identity)  # a second entry keeps the first
    cached = read_cache(path)
    found = lookup("m", HERE, cached, TunedProfiles(), identity)
    assert found is not None and found.source == "cached" and found.fingerprint == HERE
    assert found.entry.profile == entry().profile
    assert cached.models["m"][HERE].weights == "w1" and cached.models["m"][HERE].libraries == LIBS


@pytest.mark.parametrize(
    ("now", "why"),
    [
        (Identity("w2", LIBS), "weights changed"),
        (Identity("w1", {**LIBS, "onnxruntime": "1.32.0"}), "onnxruntime 1.31.0 -> 1.32.0"),
    ],
)
def test_a_stale_entry_is_ignored_and_the_log_says_why(
    tmp_path: Path, now: Identity, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "profiles.yaml"
    record(path, "m", HERE, entry(), Identity("w1", LIBS))
    with caplog.at_level("INFO", logger=cache.__name__):
        assert lookup("m", HERE, read_cache(path), TunedProfiles(), now) is None
    assert "stale" in caplog.text and why in caplog.text


def test_an_unreadable_cache_is_empty_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text("models: [not, a, mapping]\n")
    with caplog.at_level("WARNING", logger=cache.__name__):
        assert read_cache(path).models == {}
    assert "ignoring the tuned profiles cache" in caplog.text
    assert read_cache(tmp_path / "absent.yaml").models == {}


@pytest.mark.parametrize(
    ("threads", "tuned_cores", "cores", "scaled"),
    [
        (4, 4, 2, 2),  # used every core: uses every core here
        (4, 4, 16, 16),
        (2, 4, 8, 4),  # half: half
        (1, 4, 2, 1),  # at least one
        (1, 8, 2, 1),
        (0, 4, 2, 0),  # 0 means every core already
    ],
)
def test_threads_scale_to_this_machines_cores(
    threads: int, tuned_cores: int, cores: int, scaled: int
) -> None:
    assert scale_threads(threads, tuned_cores, cores) == scaled


def test_split_cores_reads_cpu_fingerprints_only() -> None:
    assert split_cores(HERE) == ("cpu:intel-xeon:amx_bf16+avx2", 2)
    assert split_cores("cuda:nvidia-h100") is None


def test_a_profile_from_the_same_cpu_with_other_cores_is_borrowed_with_scaled_threads() -> None:
    shipped = TunedProfiles().with_entry(
        "m", "cpu:intel-xeon:amx_bf16+avx2:8c", entry(threads=4, runner_up_threads=8)
    )
    shipped = shipped.with_entry("m", "cpu:intel-xeon:amx_bf16+avx2:4c", entry(threads=4))
    shipped = shipped.with_entry("m", "cpu:amd-epyc:amx_bf16+avx2:2c", entry(threads=2))
    shipped = shipped.with_entry("m", "cpu:intel-xeon:avx2:2c", entry(threads=2))  # other flags
    found = borrow("m", HERE, read_cache(Path("/nonexistent")), shipped, None)
    assert found is not None and found.source == "borrowed"
    assert found.fingerprint == "cpu:intel-xeon:amx_bf16+avx2:4c"  # the nearest core count
    assert found.entry.profile["threads"] == 2  # all 4 of 4 -> all 2 of 2
    assert "borrowed from 4 cores" in found.why


def test_the_runner_ups_threads_scale_too_and_other_cpus_are_never_borrowed() -> None:
    shipped = TunedProfiles().with_entry(
        "m", "cpu:intel-xeon:amx_bf16+avx2:8c", entry(threads=4, runner_up_threads=8)
    )
    found = borrow("m", HERE, read_cache(Path("/nonexistent")), shipped, None)
    assert found is not None
    assert found.entry.profile["threads"] == 1  # half of 8 -> half of 2
    assert found.entry.measured.runner_up == {"runtime": "torch", "threads": 2}
    assert borrow("m", "cpu:amd-epyc:avx2:2c", read_cache(Path("/no")), shipped, None) is None
    assert (
        borrow("m", "cpu:intel-xeon:amx_bf16+avx2:8c", read_cache(Path("/no")), shipped, None)
        is None
    )


def test_a_stale_cached_entry_is_not_borrowed_either(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    record(path, "m", "cpu:intel-xeon:amx_bf16+avx2:4c", entry(threads=4), Identity("w1", LIBS))
    cached = read_cache(path)
    assert borrow("m", HERE, cached, TunedProfiles(), Identity("w2", LIBS)) is None
    fresh = borrow("m", HERE, cached, TunedProfiles(), Identity("w1", LIBS))
    assert fresh is not None and fresh.entry.profile["threads"] == 2


def test_the_weights_digest_is_remembered_until_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"1234")
    memo = tmp_path / "digests.json"
    hashed: list[Path] = []

    def counting(path: Path) -> str:
        hashed.append(path)
        return folder_digest(path)

    monkeypatch.setattr(cache, "folder_digest", counting)
    first = weights_digest(folder, memo)
    assert weights_digest(folder, memo) == first and len(hashed) == 1
    (folder / "weights.bin").write_bytes(b"12345")
    assert weights_digest(folder, memo) != first and len(hashed) == 2
