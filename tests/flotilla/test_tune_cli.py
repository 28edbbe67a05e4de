"""`flotilla tune` end to end on a tiny random model (plumbing: its figures mean
nothing): it writes a tuned profile for this device, and the host `flotilla serve`
builds serves the model with it, saying so in describe() (what /v1/models shows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from embedder.core.device import fingerprint
from embedder.tasks.fleet import load_fleet
from embedder.queue.inprocess import InProcessQueue
from embedder.tuned import load_tuned
from flotilla.cli import app
from flotilla.settings import Settings
from flotilla.wiring import adapter_catalog, model_host
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


@pytest.mark.usefixtures("clean_env")
async def test_tune_writes_a_profile_that_the_served_host_then_picks(
    fleet_file: Path, tmp_path: Path
) -> None:
    tuned_file, results = tmp_path / "tuned.yaml", tmp_path / "results"
    args = ["tune", "tiny", "--fleet", str(fleet_file), "--device", "cpu"]
    args += ["--tuned-file", str(tuned_file), "--results", str(results)]
    with hub_offline():
        done = CliRunner().invoke(app, [*args, "--texts", "8", "--repeats", "1"])
    assert done.exit_code == 0, done.output
    fp = fingerprint("cpu")
    entry = load_tuned(tuned_file).entry("tiny", fp)
    assert entry is not None
    assert entry.measured.worst_cosine >= 0.999 and entry.measured.tokens_per_s > 0
    assert entry.measured.calibration.startswith("English")  # not a multilingual model
    assert entry.measured.fp32_tokens_per_s
    report = json.loads(next(results.glob("*.json")).read_text())
    assert report["fingerprint"] == fp
    assert {t["stage"] for t in report["trials"]} >= {"runtime x precision", "threads"}
    assert "chosen" in done.output

    settings = Settings(fleet=fleet_file, device="cpu", tuned_file=tuned_file)
    fleet = load_fleet(fleet_file)
    host = model_host(settings, fleet, InProcessQueue(), adapter_catalog(settings, fleet))
    with hub_offline():
        async with host:
            await host.wait_ready()
    described = host.describe("tiny")["profile"]
    assert described == {"source": "tuned", "fingerprint": fp, "why": described["why"]}
    assert host.loaded["tiny"].spec.profile("cpu").model_dump(include=set(entry.profile)) == (
        entry.profile
    )
    pinned = host.describe("pinned")["profile"]
    assert pinned["source"] == "fleet" and "pins dtype float32" in pinned["why"]  # type: ignore[index]
    assert host.describe("pinned")["dtype"] == "float32"
