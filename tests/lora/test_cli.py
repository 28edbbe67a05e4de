"""`flotilla lora data|train|cost` and `flotilla eval retrieval` as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flotilla.cli import app
from lora.config import TrainConfig
from lora.manifest import MANIFEST_NAME
from lora.train import CHECKPOINT_DIR, last_checkpoint
from tests.gateway.conftest import hub_offline
from tests.lora.laws import write_laws

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_data_gesetze_writes_the_sets(runner: CliRunner, tmp_path: Path) -> None:
    laws = write_laws(tmp_path / "laws")
    out = tmp_path / "set"
    result = runner.invoke(
        app, ["lora", "data", "gesetze", "--src", str(laws), "--out", str(out),
              "--eval-laws", "TURLG"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "evaluation on turlg: 4 passages" in result.output
    for name in ("train.jsonl", "corpus.jsonl", "queries.jsonl", "qrels.tsv", "split.json"):
        assert (out / name).is_file()


def test_data_gesetze_pair_types(runner: CliRunner, tmp_path: Path) -> None:
    laws = write_laws(tmp_path / "laws")
    out = tmp_path / "set"
    result = runner.invoke(
        app, ["lora", "data", "gesetze", "--src", str(laws), "--out", str(out),
              "--eval-laws", "tverf", "--pair-types", "heading,paragraph,reference"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "9 training pairs (7 heading, 2 paragraph, 0 reference) from 2 laws" in result.output
    kinds = [json.loads(line)["kind"] for line in (out / "train.jsonl").read_text().splitlines()]
    assert sorted(set(kinds)) == ["heading", "paragraph"]
    split = json.loads((out / "split.json").read_text())
    assert split["pair_types"] == ["heading", "paragraph", "reference"]
    assert split["pairs_by_kind"] == {"heading": 7, "paragraph": 2, "reference": 0}
    refused = runner.invoke(
        app, ["lora", "data", "gesetze", "--src", str(laws), "--pair-types", "heading,body"]
    )
    assert refused.exit_code == 2 and "--pair-types" in refused.output
    assert "heading, paragraph, reference" in refused.output


def test_data_gesetze_eval_only_names_every_law(runner: CliRunner, tmp_path: Path) -> None:
    laws = write_laws(tmp_path / "laws")
    out = tmp_path / "set"
    every = "turlg,tkschg,tverf"
    refused = runner.invoke(
        app, ["lora", "data", "gesetze", "--src", str(laws), "--out", str(out),
              "--eval-laws", every],
    )  # fmt: skip
    assert refused.exit_code == 2 and "--eval-only" in refused.output
    result = runner.invoke(
        app, ["lora", "data", "gesetze", "--src", str(laws), "--out", str(out),
              "--eval-laws", every, "--eval-only"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "no training pairs" in result.output
    assert "evaluation on tkschg, turlg, tverf: 8 passages" in result.output
    assert not (out / "train.jsonl").exists() and (out / "qrels.tsv").is_file()


def test_data_gesetze_refuses_what_it_cannot_split(runner: CliRunner, tmp_path: Path) -> None:
    laws = write_laws(tmp_path / "laws")
    result = runner.invoke(
        app, ["lora", "data", "gesetze", "--src", str(laws), "--eval-laws", "bgb"]
    )
    assert result.exit_code == 2 and "unknown laws" in result.output
    result = runner.invoke(app, ["lora", "data", "gesetze", "--src", str(tmp_path / "none")])
    assert result.exit_code == 2 and "is not a folder" in result.output


def test_train_settings_are_flags_and_environment(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flotilla.lora

    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(flotilla.lora, "train", lambda *args, **kw: calls.append(args))
    monkeypatch.setenv("FLOTILLA_LORA_TARGETS", "query,value")
    pairs = tmp_path / "train.jsonl"
    pairs.write_text('{"query": "a", "positive": "b"}\n')
    result = runner.invoke(
        app, ["lora", "train", "--base", "all-minilm-l6-v2", "--pairs", str(pairs),
              "--out", str(tmp_path / "a"), "--lora-rank", "8", "--price-l4-hour-usd", "0.5"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    settings = calls[0][0]
    assert settings.lora_rank == 8  # type: ignore[attr-defined]
    assert settings.lora_targets == ["query", "value"]  # type: ignore[attr-defined]
    assert settings.price_l4_hour_usd == 0.5  # type: ignore[attr-defined]


def test_train_names_a_missing_base(runner: CliRunner, tmp_path: Path) -> None:
    pairs = tmp_path / "train.jsonl"
    pairs.write_text('{"query": "a", "positive": "b"}\n')
    result = runner.invoke(
        app, ["lora", "train", "--base", "no-such-model", "--pairs", str(pairs),
              "--out", str(tmp_path / "a")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "no-such-model" in result.output and "all-minilm-l6-v2" in result.output


def test_eval_needs_something_to_evaluate(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["eval", "retrieval", "--queries", str(tmp_path / "q.jsonl"), "--qrels",
              str(tmp_path / "r.tsv"), "--no-bm25"],
    )  # fmt: skip
    assert result.exit_code == 2 and "nothing to evaluate" in result.output


def tiny_fleet_and_set(runner: CliRunner, tmp_path: Path, model: Path) -> tuple[Path, Path]:
    """A fleet file serving ``model`` as 'tiny', and a set from the test laws (tverf held out)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"models": {"tiny": {"source": {"path": str(model)}}}}))
    laws = write_laws(tmp_path / "laws")
    data = tmp_path / "set"
    assert runner.invoke(app, ["lora", "data", "gesetze", "--src", str(laws), "--out",
                               str(data), "--eval-laws", "tverf"]).exit_code == 0  # fmt: skip
    return fleet, data


@pytest.mark.slow
def test_train_then_cost_on_a_fleet_model(
    runner: CliRunner, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    fleet, data = tiny_fleet_and_set(runner, tmp_path, tiny_models["tiny-a"])
    out = tmp_path / "adapter"
    with hub_offline():
        result = runner.invoke(
            app, ["lora", "train", "--base", "tiny", "--pairs", str(data / "train.jsonl"),
                  "--out", str(out), "--fleet", str(fleet), "--device", "cpu",
                  "--lora-rank", "2", "--train-batch-size", "2", "--train-max-steps", "2"],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "tokens/s" in result.output and "core-seconds" in result.output
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["base"]["name"] == "tiny" and manifest["training"]["steps"] == 2

    result = runner.invoke(
        app, ["lora", "cost", str(out), "--tokens-per-s", "1000", "--gpu", "h100",
              "--price-h100-hour-usd", "3.6"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    projected = json.loads(result.output)["projected"]
    assert projected["seconds"] == pytest.approx(manifest["measured"]["tokens"] / 1000)
    assert projected["usd"] == pytest.approx(projected["seconds"] / 3600 * 3.6)


@pytest.mark.slow
def test_sweep_trains_scores_and_reports(
    runner: CliRunner, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    fleet, data = tiny_fleet_and_set(runner, tmp_path, tiny_models["tiny-a"])
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"lora_rank": [2, 4], "lora_targets": ["query,value"],
        "train_max_steps": [2], "train_batch_size": [2], "train_negatives": [0, 1],
        "train_scale": [20.0], "train_batches": ["law"]}))  # fmt: skip
    out = tmp_path / "sweep"
    command = ["lora", "sweep", "--base", "tiny", "--data", str(data), "--out", str(out),
               "--space", str(space), "--max-trials", "2", "--seeds", "2", "--first-steps", "2",
               "--fleet", str(fleet), "--device", "cpu", "--lora-rank", "2",
               "--train-batch-size", "2", "--lora-dropout", "0.05",
               "--train-batches", "law"]  # fmt: skip
    with hub_offline():
        result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "sweep.json").read_text())
    trials = report["trials"]
    assert len(trials) == 2 and all(t["state"] == "done" for t in trials)
    assert trials[0]["recipe"]["lora_rank"] == 2  # the first trial: the defaults given
    assert trials[0]["recipe"]["train_batches"] == "law"
    for t in trials:
        assert 0 <= t["ndcg@10"] <= 1 and t["device_s"] > 0 and t["peak_rss_bytes"] > 0
        # each trial's adapter was trained in its own process with its own knobs
        manifest = json.loads((out / "trials" / f"t{t['trial']:03d}" / "adapter" /
                               MANIFEST_NAME).read_text())  # fmt: skip
        assert manifest["adapter"]["rank"] == t["recipe"]["lora_rank"]
        assert manifest["adapter"]["alpha"] == 2 * t["recipe"]["lora_rank"]
        assert manifest["training"]["batches"] == t["recipe"]["train_batches"]
    chosen = report["chosen"]
    assert len(chosen["seeds"]) == 2 and chosen["seeds"][1]["seed"] == 1
    assert chosen["comparison"]["baseline"] == "tiny"
    assert set(chosen["comparison"]["per_law"]) == {"tverf"}
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["lora_rank"] == trials[chosen["trial"]]["recipe"]["lora_rank"]
    # the settings no trial changed are the run's too: the recipe trains it again
    assert report["settings"]["lora_dropout"] == recipe["lora_dropout"] == 0.05
    assert TrainConfig.model_validate(recipe).lora_rank == recipe["lora_rank"]
    assert "every trial: lora_dropout 0.05" in (out / "sweep.md").read_text()
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "chosen: trial" in (out / "sweep.md").read_text()
    # run again: the finished trials stand, nothing is trained, the report is the same
    with hub_offline():
        again = runner.invoke(app, command)
    assert again.exit_code == 0, again.output
    rerun = json.loads((out / "sweep.json").read_text())
    assert [t["ndcg@10"] for t in rerun["trials"]] == [t["ndcg@10"] for t in trials]
    assert rerun["chosen"]["comparison"] == chosen["comparison"]


def _processes_naming(text: str) -> list[int]:
    """The live processes whose command line holds ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone, or not a process
            continue
        if proc.name.isdigit() and text in cmdline:
            found.append(int(proc.name))
    return found


def _sweep_stopped_once(command: list[str], ready: Callable[[], bool]) -> str:
    """Run the sweep until ``ready()``, send it SIGTERM, and return what it printed."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert "sweep stopped; the same command resumes it" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return output


@pytest.mark.slow
def test_sigterm_stops_the_sweep_and_its_trial_which_it_resumes_with(
    runner: CliRunner, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """SIGINT takes the same path (the loop's stop event); a terminal's Ctrl-C reaches
    the sweep alone, as its trial runs in a session of its own."""
    fleet, data = tiny_fleet_and_set(runner, tmp_path, tiny_models["tiny-a"])
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"lora_rank": [2], "lora_targets": ["query,value"],
        "train_max_steps": [100_000], "train_batch_size": [2]}))  # fmt: skip
    out = tmp_path / "sweep"
    command = [sys.executable, "-m", "flotilla", "lora", "sweep", "--base", "tiny", "--data",
        str(data), "--out", str(out), "--space", str(space), "--first-steps", "100000",
        "--fleet", str(fleet), "--device", "cpu", "--lora-rank", "2", "--train-batch-size",
        "2", "--train-checkpoint-steps", "3"]  # fmt: skip
    first = out / "trials" / "t000"
    checkpoints = first / "adapter" / CHECKPOINT_DIR

    def checkpointed() -> bool:  # the trial is training and has saved a checkpoint
        return last_checkpoint(checkpoints) is not None and bool(_processes_naming(str(first)))

    _sweep_stopped_once(command, checkpointed)
    assert not _processes_naming(str(first)), "the trial outlived its sweep"
    assert not (out / "sweep.json").exists()  # no report of a search that did not finish
    import optuna

    study = optuna.load_study(study_name="lora-sweep", storage=f"sqlite:///{out / 'study.db'}")
    stopped = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    # not recorded as a result, and first in line when the same command runs again
    assert len(stopped) == 1 and "state" not in stopped[0].user_attrs
    assert any(t.system_attrs.get("fixed_params") == stopped[0].params for t in waiting)
    saved = last_checkpoint(checkpoints)
    assert saved is not None
    # the same command again: the trial, as t001, goes on from t000's last checkpoint
    resumed = out / "trials" / "t001"
    log = resumed / "train.log"
    went_on = f"resuming from {resumed / 'adapter' / CHECKPOINT_DIR / saved.name}"

    def going_on() -> bool:
        return log.is_file() and "step " in log.read_text().partition(went_on)[2]

    _sweep_stopped_once(command, going_on)
    assert not first.exists() and not _processes_naming(str(resumed))
