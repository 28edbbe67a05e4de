"""Which profile a model is served with: the tuned one where the fingerprint matches and
the fleet leaves the choice open (dtype: auto), the fleet's own otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedder.core.fleet import FleetError, ModelSpec
from embedder.tasks.fleet import parse_fleet
from embedder.tuned import (
    SHIPPED_LABEL,
    Measured,
    TunedEntry,
    TunedProfiles,
    load_tuned,
    profile_for,
    save_tuned,
    serving_profiles,
    user_tuned_file,
)

FP = "cpu:amd-epyc:avx2+avx512_bf16:2c"
TUNED_FIELDS = {
    "runtime": "torch",
    "dtype": "bfloat16",
    "threads": 1,
    "forward_tokens": 1024,
    "forward_max_sequences": 32,
    "max_batch_tokens": 4096,
}


def spec(dtype: str = "auto", **fields: object) -> ModelSpec:
    profile = {"dtype": dtype, "max_wait_ms": 7, "max_batch_requests": 9, **fields}
    fleet = parse_fleet(
        {"models": {"m": {"source": {"path": "/tmp"}, "profiles": {"cpu": profile}}}}
    )
    return fleet.get("m")


def tuned() -> TunedProfiles:
    entry = TunedEntry(
        profile=TUNED_FIELDS, measured=Measured(tokens_per_s=20_000, worst_cosine=0.9999)
    )
    return TunedProfiles().with_entry("m", FP, entry)


def test_a_matching_fingerprint_gets_the_tuned_fields_and_keeps_the_fleets_others() -> None:
    choice = profile_for(spec(), "cpu", FP, tuned())
    assert choice.source == "tuned"
    assert choice.profile.model_dump(include=set(TUNED_FIELDS)) == TUNED_FIELDS
    assert (choice.profile.max_wait_ms, choice.profile.max_batch_requests) == (7, 9)
    assert FP in choice.why and "20,000 tok/s" in choice.why
    served = choice.apply(spec(), "cpu")
    assert served.profile("cpu") == choice.profile


def test_another_device_gets_the_fleets_profile_and_says_why() -> None:
    other = "cpu:intel-xeon:amx_bf16:2c"
    choice = profile_for(spec(), "cpu", other, tuned())
    assert choice.source == "fleet"
    assert choice.profile == spec().profile("cpu")
    assert choice.why == f"no tuned profile for {other}; the fleet's profile"


def test_a_fleet_that_pins_its_dtype_keeps_it_even_where_a_tuned_profile_matches() -> None:
    choice = profile_for(spec("float32"), "cpu", FP, tuned())
    assert choice.source == "fleet"
    assert choice.profile.dtype == "float32"
    assert "pins dtype float32" in choice.why


def test_a_fleet_that_names_its_runtime_keeps_it_even_where_a_tuned_profile_matches() -> None:
    choice = profile_for(spec(runtime="emulated"), "cpu", FP, tuned())
    assert choice.source == "fleet"
    assert choice.profile.runtime == "emulated"
    assert "names runtime emulated" in choice.why


def test_the_file_round_trips_and_keeps_other_entries(tmp_path: Path) -> None:
    path = save_tuned(tuned(), tmp_path / "tuned.yaml")
    again = load_tuned(path)
    assert again == tuned()
    more = again.with_entry("m", "cpu:other:none:8c", again.models["m"][FP])
    assert set(load_tuned(save_tuned(more, path)).models["m"]) == {FP, "cpu:other:none:8c"}
    assert path.read_text().startswith("# Tuned profiles")


def test_a_missing_file_is_empty_and_a_malformed_one_names_itself(tmp_path: Path) -> None:
    assert load_tuned(tmp_path / "absent.yaml") == TunedProfiles()
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: {m: {fp: {profile: {max_wait_ms: 3}, measured: {}}}}")
    with pytest.raises(FleetError, match=r"bad\.yaml"):
        load_tuned(bad)


def test_the_shipped_file_is_read_from_the_package_and_holds_profiles() -> None:
    shipped = load_tuned()
    assert shipped.entry("all-minilm-l6-v2", SHIPPED_FP) is not None
    assert serving_profiles(None, Path("/nonexistent")).origin("all-minilm-l6-v2", SHIPPED_FP) == (
        SHIPPED_LABEL
    )


# -- which file wins: the user's over the shipped one, per model and fingerprint ----------

SHIPPED_FP = "cpu:amd-epyc:avx2+avx512_bf16+avx512_vnni+avx512f+avx_vnni:2c"


def shipped_spec(model: str) -> ModelSpec:
    fleet = parse_fleet(
        {"models": {model: {"source": {"path": "/tmp"}, "profiles": {"cpu": {"dtype": "auto"}}}}}
    )
    return fleet.get(model)


def users_entry(tokens_per_s: float) -> TunedEntry:
    return TunedEntry(
        profile=TUNED_FIELDS | {"threads": 2},
        measured=Measured(tokens_per_s=tokens_per_s, worst_cosine=0.99995, date="2026-12-07"),
    )


def test_the_users_file_wins_over_the_shipped_one_for_its_fingerprint_only(
    tmp_path: Path,
) -> None:
    other_fp = "cpu:intel-xeon:amx_bf16:2c"
    mine = TunedProfiles().with_entry("all-minilm-l6-v2", SHIPPED_FP, users_entry(31_000))
    mine = mine.with_entry("all-minilm-l6-v2", other_fp, users_entry(42_000))
    written = save_tuned(mine, user_tuned_file(tmp_path))
    assert written == tmp_path / "tuned" / "tuned.yaml"
    served = serving_profiles(None, tmp_path)
    spec = shipped_spec("all-minilm-l6-v2")
    for fp, figure in ((SHIPPED_FP, "31,000 tok/s"), (other_fp, "42,000 tok/s")):
        choice = profile_for(spec, "cpu", fp, served)
        assert choice.source == "tuned" and choice.profile.threads == 2
        assert f"(from {written})" in choice.why and figure in choice.why
    # The shipped entries the user's file does not replace are still served, and say so.
    e5 = profile_for(shipped_spec("multilingual-e5-small"), "cpu", SHIPPED_FP, served)
    shipped_e5 = load_tuned().entry("multilingual-e5-small", SHIPPED_FP)
    assert e5.source == "tuned" and f"({SHIPPED_LABEL})" in e5.why
    assert shipped_e5 is not None and e5.profile.threads == shipped_e5.profile["threads"]


def test_a_named_tuned_file_is_read_alone(tmp_path: Path) -> None:
    """--tuned-file replaces both: an empty one serves the fleet's profiles (how the
    benchmarks hide the shipped ones), and the user's file is not read either."""
    save_tuned(
        tuned().with_entry("all-minilm-l6-v2", SHIPPED_FP, users_entry(1)),
        user_tuned_file(tmp_path),
    )
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    served = serving_profiles(empty, tmp_path)
    assert served == TunedProfiles()
    choice = profile_for(shipped_spec("all-minilm-l6-v2"), "cpu", SHIPPED_FP, served)
    assert choice.source == "fleet"
    named = serving_profiles(save_tuned(tuned(), tmp_path / "named.yaml"), tmp_path)
    assert named.models == tuned().models
    assert f"(from {tmp_path / 'named.yaml'})" in profile_for(spec(), "cpu", FP, named).why


def tuned_on(runtime: str, runner_up: dict[str, object] | None) -> TunedProfiles:
    """The fastest tuned runtime ``runtime``, with the given runner-up."""
    entry = TunedEntry(
        profile=TUNED_FIELDS | {"runtime": runtime},
        measured=Measured(tokens_per_s=5_500, worst_cosine=0.99999, runner_up=runner_up),
    )
    return TunedProfiles().with_entry("m", FP, entry)


@pytest.mark.parametrize("runtime", ["openvino", "onnx"])
def test_a_model_serving_adapters_keeps_its_tuned_graph_runtime(runtime: str) -> None:
    runner_up = TUNED_FIELDS | {"forward_tokens": 2048, "tokens_per_s": 3_100.0}
    choice = profile_for(spec(), "cpu", FP, tuned_on(runtime, runner_up), adapters=True)
    assert choice.source == "tuned" and choice.profile.runtime == runtime
    assert "5,500 tok/s" in choice.why and "adapters" not in choice.why


def test_a_runtime_without_adapters_gives_way_to_the_runner_up() -> None:
    runner_up = TUNED_FIELDS | {"forward_tokens": 2048, "tokens_per_s": 3_100.0}
    choice = profile_for(spec(), "cpu", FP, tuned_on("emulated", runner_up), adapters=True)
    assert choice.source == "tuned" and choice.profile.runtime == "torch"
    assert choice.profile.forward_tokens == 2048 and choice.profile.max_wait_ms == 7
    assert "emulated cannot take adapters" in choice.why and "3,100 tok/s" in choice.why
    # without adapters the fastest serves
    assert profile_for(spec(), "cpu", FP, tuned_on("emulated", runner_up)).profile.runtime == (
        "emulated"
    )


def test_without_a_runner_up_that_runs_adapters_the_fleets_profile_serves() -> None:
    emulated = TUNED_FIELDS | {"runtime": "emulated", "tokens_per_s": 4_000.0}
    for runner_up in (emulated, None):
        choice = profile_for(spec(), "cpu", FP, tuned_on("emulated", runner_up), adapters=True)
        assert choice.source == "fleet" and choice.profile.runtime == "torch"
        assert "cannot take adapters" in choice.why
