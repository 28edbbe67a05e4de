"""Adapters without torch: the catalog (fleet + registered folders, validation), the LRU
of resident adapters, batch grouping with and without mixing, and run_batch failing
only the jobs whose adapter cannot serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedder.core.adapters import AdapterCatalog, ResidentAdapters, check_adapter
from embedder.tasks.embed.batching import BatchLimits, form_batch
from embedder.tasks.embed.codecs import RequestLimits
from embedder.core.errors import AdapterInvalid, AdapterNotFound
from embedder.tasks.embed.execute import LoadedModel, run_batch
from embedder.core.fleet import Fleet
from embedder.core.jobs import ApiShape, Job, JobResult
from tests.fakes import FakeRuntime, fake_fleet

NOW = 1_000.0


def adapter_folder(path: Path, *, base: str | None = "model", peft_type: str = "LORA") -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": peft_type, "r": 8}))
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    if base is not None:
        (path / "flotilla_adapter.json").write_text(json.dumps({"base": {"name": base}}))
    return path


def fleet_with(tmp_path: Path, adapters: dict[str, Path]) -> Fleet:
    raw = fake_fleet("model", "other").model_dump(mode="json")
    raw["models"]["model"]["adapters"] = {k: str(v) for k, v in adapters.items()}
    raw["models"]["model"]["aliases"] = ["org/model"]
    return Fleet.model_validate(raw)


# -- the catalog ---------------------------------------------------------------


def test_fleet_and_registered_adapters_are_found(tmp_path: Path) -> None:
    declared = adapter_folder(tmp_path / "declared")
    catalog = AdapterCatalog(fleet_with(tmp_path, {"legal": declared}), tmp_path / "registry")
    assert catalog.names("model") == {"legal": declared}
    info = catalog.register("org/model", "medical", adapter_folder(tmp_path / "src"))
    assert info.folder == tmp_path / "registry" / "model" / "medical"
    assert info.rank == 8
    assert catalog.find("model", "medical") == info.folder
    assert sorted(catalog.names("model")) == ["legal", "medical"]
    assert catalog.names("other") == {}


def test_an_adapter_registered_by_another_process_is_found_on_first_use(
    tmp_path: Path,
) -> None:
    fleet = fleet_with(tmp_path, {})
    serving = AdapterCatalog(fleet, tmp_path / "registry")
    with pytest.raises(AdapterNotFound):
        serving.find("model", "late")
    AdapterCatalog(fleet, tmp_path / "registry").register(
        "model", "late", adapter_folder(tmp_path / "src")
    )
    assert serving.find("model", "late") == tmp_path / "registry" / "model" / "late"


def test_an_unknown_adapter_is_a_404_that_lists_the_known_ones(tmp_path: Path) -> None:
    catalog = AdapterCatalog(fleet_with(tmp_path, {"legal": adapter_folder(tmp_path / "a")}))
    with pytest.raises(AdapterNotFound) as caught:
        catalog.find("model", "medical")
    assert caught.value.http_status == 404
    assert "'medical'" in caught.value.message and "legal" in caught.value.message
    assert "flotilla lora add" in caught.value.message


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p, "does not exist"),
        (lambda p: (p.mkdir(), p)[1], "adapter_config.json"),
        (lambda p: adapter_folder(p, peft_type="IA3"), "only LoRA"),
        (lambda p: adapter_folder(p, base="another-model"), "trained on 'another-model'"),
        (
            lambda p: (adapter_folder(p), (p / "adapter_model.safetensors").unlink())[0],
            "no weights",
        ),
    ],
)
def test_bad_adapter_folders_are_refused_with_the_reason(
    tmp_path: Path, make: object, says: str
) -> None:
    folder = make(tmp_path / "adapter")  # type: ignore[operator]
    spec = fleet_with(tmp_path, {}).get("model")
    with pytest.raises(AdapterInvalid) as caught:
        check_adapter(spec, "legal", folder)
    assert says in caught.value.message
    assert caught.value.http_status == 422


def test_names_with_a_colon_or_a_clash_are_refused(tmp_path: Path) -> None:
    catalog = AdapterCatalog(fleet_with(tmp_path, {}), tmp_path / "registry")
    with pytest.raises(AdapterInvalid, match="no ':'"):
        catalog.register("model", "a:b", adapter_folder(tmp_path / "x"))
    catalog.register("model", "legal", adapter_folder(tmp_path / "y"))
    with pytest.raises(AdapterInvalid, match="already exists"):
        catalog.register("model", "legal", adapter_folder(tmp_path / "z"))


# -- resident adapters ----------------------------------------------------------


class Recorder:
    def __init__(self, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.events: list[str] = []
        self.fail = fail

    def load(self, name: str, folder: Path) -> None:
        if name in self.fail:
            raise RuntimeError("size mismatch")
        self.events.append(f"+{name}")

    def unload(self, name: str) -> None:
        self.events.append(f"-{name}")


def test_least_recently_used_adapters_leave_first() -> None:
    rec = Recorder()
    slots = ResidentAdapters(2, rec.load, rec.unload)
    p = Path("/adapters")
    slots.ensure({"a": p / "a"})
    slots.ensure({"b": p / "b"})
    slots.ensure({"a": p / "a"})  # a is now the most recent
    slots.ensure({"c": p / "c"})  # b goes
    assert rec.events == ["+a", "+b", "-b", "+c"]
    assert slots.names == ["a", "c"]


def test_a_batch_needing_more_than_the_cap_keeps_them_all_until_the_next() -> None:
    rec = Recorder()
    slots = ResidentAdapters(1, rec.load, rec.unload)
    p = Path("/adapters")
    assert slots.ensure({"a": p / "a", "b": p / "b"}) == {}
    assert slots.names == ["a", "b"]
    slots.ensure({"c": p / "c"})
    assert slots.names == ["c"]


def test_an_adapter_that_fails_to_load_is_reported_and_not_resident() -> None:
    rec = Recorder(fail={"bad"})
    slots = ResidentAdapters(4, rec.load, rec.unload)
    failed = slots.ensure({"bad": Path("/bad"), "good": Path("/good")})
    assert set(failed) == {"bad"} and isinstance(failed["bad"], AdapterInvalid)
    assert "size mismatch" in failed["bad"].message
    assert slots.names == ["good"]


def test_a_folder_registered_again_is_reloaded() -> None:
    rec = Recorder()
    slots = ResidentAdapters(4, rec.load, rec.unload)
    slots.ensure({"a": Path("/v1")})
    slots.ensure({"a": Path("/v2")})
    assert rec.events == ["+a", "-a", "+a"]


# -- batching --------------------------------------------------------------------


def job(id: str, adapter: str | None, tokens: int = 10, text: str = "hello") -> Job:
    return Job(
        id=id,
        model="model",
        shape=ApiShape.OPENAI_EMBEDDINGS,
        body=json.dumps({"input": [text], "model": "model"}).encode(),
        est_tokens=tokens,
        deadline=NOW + 30,
        enqueued_at=NOW - 1 + int(id[1:]) * 0.01,
        adapter=adapter,
    )


@pytest.mark.parametrize("mix", [False, True])
def test_batches_mix_adapters_only_where_the_profile_says(mix: bool) -> None:
    pending = [job("j0", None), job("j1", "a"), job("j2", "b"), job("j3", None), job("j4", "a")]
    limits = {
        "model": BatchLimits(max_tokens=1000, max_requests=16, max_wait_s=0, mix_adapters=mix)
    }
    plan = form_batch(pending, limits, NOW)
    adapters = {j.adapter for j in plan.batch}
    if mix:
        assert len(plan.batch) == 5 and adapters == {None, "a", "b"}
    else:
        assert adapters == {None} and {j.id for j in plan.batch} == {"j0", "j3"}


# -- running a batch ---------------------------------------------------------------


def test_a_mixed_batch_runs_each_row_with_its_adapter_and_fails_only_bad_ones(
    tmp_path: Path,
) -> None:
    fleet = fleet_with(
        tmp_path,
        {
            "a": adapter_folder(tmp_path / "a"),
            "b": adapter_folder(tmp_path / "b"),
            "broken": adapter_folder(tmp_path / "broken"),
        },
    )
    (tmp_path / "broken" / "broken").touch()  # the fake runtime refuses to load it
    spec = fleet.get("model")
    fake = FakeRuntime(spec)
    limits = BatchLimits(max_tokens=1000, max_requests=16, max_wait_s=0, mix_adapters=True)
    resident = ResidentAdapters(2, fake.load_adapter, fake.unload_adapter)
    model = LoadedModel(spec, fake, limits, AdapterCatalog(fleet), resident)
    jobs = [
        job("j0", None, text="base text"),
        job("j1", "a", text="for a"),
        job("j2", "b", text="for b"),
        job("j3", "missing", text="nobody"),
        job("j4", "broken", text="broken"),
        job("j5", "a", text="again a"),
    ]
    report = run_batch(jobs, model, RequestLimits(), NOW)
    outcomes = {j.id: outcome for j, outcome in report.outcomes}
    assert isinstance(outcomes["j3"], AdapterNotFound)
    assert isinstance(outcomes["j4"], AdapterInvalid)
    assert fake.forward_calls == [4]  # one pass for the four that can run
    assert sorted(fake.adapter_calls[0], key=str) == sorted([None, "a", "b", "a"], key=str)
    for id, text, adapter in [
        ("j0", "base text", None),
        ("j1", "for a", "a"),
        ("j2", "for b", "b"),
        ("j5", "again a", "a"),
    ]:
        result = outcomes[id]
        assert isinstance(result, JobResult)
        got = np.asarray(json.loads(result.body)["data"][0]["embedding"], dtype=np.float32)
        np.testing.assert_allclose(got, fake.expected_vector(text, adapter=adapter), atol=1e-5)


def test_a_model_without_a_catalog_refuses_adapters(tmp_path: Path) -> None:
    spec = fake_fleet("model").get("model")
    fake = FakeRuntime(spec)
    model = LoadedModel(spec, fake, BatchLimits(1000, 16, 0))
    report = run_batch([job("j0", "a"), job("j1", None)], model, RequestLimits(), NOW)
    outcomes = {j.id: outcome for j, outcome in report.outcomes}
    assert isinstance(outcomes["j0"], AdapterNotFound)
    assert isinstance(outcomes["j1"], JobResult)
