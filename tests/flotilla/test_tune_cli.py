"""`flotilla tune` end to end on a tiny random model (plumbing: its figures mean
nothing): it writes a tuned profile for this device, and the host `flotilla serve`
builds serves the model with it, saying so in describe() (what /v1/models shows)."""

from __future__ import annotations

import dataclasses
import io
import json
from importlib import resources
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from embedder.core.device import fingerprint
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.engine import LoadedEncoders
from embedder.tasks.fleet import load_fleet
from embedder.tuned import load_tuned, serving_profiles, user_tuned_file
from embedder.tuning.cache import cache_file, read_cache
from embedder.tuning.quiet import Quiet
from flotilla.cli import app
from flotilla.settings import Settings
from flotilla.wiring import adapter_catalog, model_host
from tests.embedder.tuning.test_quiet import ScriptedMeter, Sleeps
from tests.gateway.conftest import hub_offline
from tests.tiny_models import build_tiny_embedder


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tune")
    with hub_offline():
        model_dir = build_tiny_embedder(folder)
    open_profile = {"dtype": "auto", "max_batch_tokens": 1024, "max_wait_ms": 2}
    models = {
        name: {
            "source": {"path": str(model_dir)},
            "max_tokens": 64,
            "profiles": {"cpu": {**open_profile, **({"dtype": "float32"} if pinned else {})}},
        }
        for name, pinned in (("tiny", False), ("pinned", True))
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    return path


@pytest.fixture(autouse=True)
def quiet_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quiet checks read a scripted load, not this (shared) machine's."""
    import flotilla.tune

    monkeypatch.setattr(flotilla.tune, "Quiet", lambda: Quiet(ScriptedMeter(), sleep=Sleeps()))


@pytest.mark.usefixtures("clean_env")
async def test_tune_writes_a_profile_that_the_served_host_then_picks(
    fleet_file: Path, tmp_path: Path
) -> None:
    tuned_file, results = tmp_path / "tuned.yaml", tmp_path / "results"
    args = ["tune", "tiny", "--fleet", str(fleet_file), "--device", "cpu"]
    args += ["--tuned-file", str(tuned_file), "--results", str(results)]
    args += ["--model-cache-dir", str(tmp_path / "cache")]
    with hub_offline():
        done = CliRunner().invoke(app, [*args, "--texts", "8", "--repeats", "1"])
    assert done.exit_code == 0, done.output
    fp = fingerprint("cpu")
    entry = load_tuned(tuned_file).entry("tiny", fp)
    assert entry is not None
    assert entry.measured.worst_cosine >= 0.999 and entry.measured.tokens_per_s > 0
    assert entry.measured.calibration.startswith("English")  # not a multilingual model
    assert entry.measured.fp32_tokens_per_s
    assert entry.measured.other_load_cores == 0.0 and entry.measured.disturbed_rounds == 0
    assert entry.measured.noisy is None
    report = json.loads(next(results.glob("*.json")).read_text())
    assert report["fingerprint"] == fp
    assert {t["stage"] for t in report["trials"]} >= {"runtime x precision", "threads"}
    assert "chosen" in done.output
    # Kept for this machine too, with what it was measured with.
    kept = read_cache(cache_file(tmp_path / "cache")).models["tiny"][fp]
    assert kept.profile == entry.profile and kept.weights

    settings = Settings(fleet=fleet_file, device="cpu", tuned_file=tuned_file)
    fleet = load_fleet(fleet_file)
    host = model_host(settings, fleet, InProcessQueue(), adapter_catalog(settings, fleet))
    with hub_offline():
        async with host:
            await host.wait_ready()
    described = host.describe("tiny")["profile"]
    assert described == {"source": "tuned", "fingerprint": fp, "why": described["why"]}
    assert LoadedEncoders(host.engines)["tiny"].spec.profile("cpu").model_dump(
        include=set(entry.profile)
    ) == (entry.profile)
    pinned = host.describe("pinned")["profile"]
    assert pinned["source"] == "fleet" and "pins dtype float32" in pinned["why"]  # type: ignore[index]
    assert host.describe("pinned")["dtype"] == "float32"


# -- a CPU busy with other processes' work: no profile, unless asked for -------------


@pytest.mark.usefixtures("clean_env")
def test_tune_beside_a_busy_cpu_refuses_to_write_unless_allowed(
    fleet_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flotilla.tune

    busy = lambda: Quiet(ScriptedMeter(then=1.4), sleep=Sleeps(), wait_s=1.0)  # noqa: E731
    monkeypatch.setattr(flotilla.tune, "Quiet", busy)
    tuned_file = tmp_path / "tuned.yaml"
    args = ["tune", "tiny", "--fleet", str(fleet_file), "--device", "cpu", "--quick"]
    args += ["--tuned-file", str(tuned_file), "--results", str(tmp_path / "results")]
    args += ["--texts", "8", "--repeats", "1"]
    with hub_offline():
        refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 1, refused.output
    assert "1.40 cores" in refused.output and "--allow-noisy" in refused.output
    assert not tuned_file.exists()
    with hub_offline():
        allowed = CliRunner().invoke(app, [*args, "--allow-noisy"])
    assert allowed.exit_code == 0, allowed.output
    entry = load_tuned(tuned_file).entry("tiny", fingerprint("cpu"))
    assert entry is not None and entry.measured.noisy is True
    assert entry.measured.other_load_cores == 1.4
    assert entry.measured.disturbed_rounds == 3  # the first round's repeats; then no more


@pytest.mark.usefixtures("clean_env")
def test_tune_writes_the_users_file_not_the_installed_package(
    fleet_file: Path, tmp_path: Path
) -> None:
    """With no --tuned-file, the profile goes to <model-cache-dir>/tuned/tuned.yaml, which
    serving reads over the shipped file; the package's own file is left as it was."""
    shipped = resources.files("embedder").joinpath("tuned.yaml").read_bytes()
    cache = tmp_path / "cache"
    args = ["tune", "tiny", "--fleet", str(fleet_file), "--device", "cpu", "--quick"]
    args += ["--model-cache-dir", str(cache), "--results", str(tmp_path / "results")]
    with hub_offline():
        done = CliRunner().invoke(app, [*args, "--texts", "8", "--repeats", "1"])
    assert done.exit_code == 0, done.output
    mine = user_tuned_file(cache)
    assert mine == cache / "tuned" / "tuned.yaml"
    assert f"tuned profile written to {mine}" in " ".join(done.output.split())
    fp = fingerprint("cpu")
    assert load_tuned(mine).entry("tiny", fp) is not None
    assert resources.files("embedder").joinpath("tuned.yaml").read_bytes() == shipped
    served = serving_profiles(None, cache)
    assert served.origin("tiny", fp) == f"from {mine}"
    assert served.entry("all-minilm-l6-v2", next(iter(load_tuned().models["all-minilm-l6-v2"])))


def test_a_cuda_device_is_tuned_with_the_cuda_plan(
    fleet_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan follows the device, no GPU needed to check which (the search is stopped
    before it loads anything)."""
    import flotilla.tune
    from embedder.tuning.candidates import CUDA

    class Planned(Exception):
        pass

    plans = []

    def stop(*args: object) -> None:
        plans.append(args[3])
        raise Planned

    monkeypatch.setattr(flotilla.tune, "fingerprint", lambda device: f"{device}:test")
    monkeypatch.setattr(flotilla.tune, "_search", stop)
    settings = Settings(fleet=fleet_file, device="cuda", tuned_file=tmp_path / "t.yaml")
    with pytest.raises(Planned):
        flotilla.tune.tune(settings, ["tiny"], results=tmp_path, repeats=2)
    assert plans == [dataclasses.replace(CUDA, repeats=2)]


# -- the laws multilingual models calibrate on: only where --calibration-dir points ------


@pytest.mark.usefixtures("clean_env")
def test_gesetze_without_a_folder_of_laws_names_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flotilla.tune

    ran: list[object] = []
    monkeypatch.setattr(flotilla.tune, "tune", lambda *args, **kwargs: ran.append(args))
    done = CliRunner().invoke(app, ["tune", "--calibration", "gesetze"])
    assert done.exit_code == 2, done.output
    assert "--calibration-dir" in done.output and "FLOTILLA_CALIBRATION_DIR" in done.output
    missing = ["tune", "--calibration-dir", str(tmp_path / "absent")]
    done = CliRunner().invoke(app, missing)
    assert done.exit_code == 2, done.output
    assert "is not a folder" in done.output
    assert ran == []


def test_calibration_takes_laws_only_from_the_folder_given(tmp_path: Path) -> None:
    from flotilla.tune import NoLaws, calibration

    spec = load_fleet().get("multilingual-e5-small")
    console = Console(file=io.StringIO())
    english = calibration(spec, "auto", None, 8, console)
    assert english.note.startswith("English")
    assert "--calibration-dir" in english.note  # says what would give it German law
    with pytest.raises(NoLaws, match="--calibration-dir"):
        calibration(spec, "gesetze", None, 8, console)
    with pytest.raises(NoLaws, match="no German laws"):
        calibration(spec, "auto", tmp_path, 8, console)  # a folder, but no laws in it
    (tmp_path / "bgb.md").write_text(LAW, encoding="utf-8")
    german = calibration(spec, "auto", tmp_path, 8, console)
    assert german.note.startswith("German law from")


LAW = """# Bürgerliches Gesetzbuch

###### § 1 Beginn der Rechtsfähigkeit

Die Rechtsfähigkeit des Menschen beginnt mit der Vollendung der Geburt.

###### § 2 Eintritt der Volljährigkeit

Die Volljährigkeit tritt mit der Vollendung des 18. Lebensjahres ein.
"""
