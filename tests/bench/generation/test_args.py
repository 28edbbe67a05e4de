"""bench.generate's options, its sides' model names, and the flotilla side's skip."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench import generate
from bench.generation import flotilla_side, local
from bench.generation.client import Stream


def test_the_defaults_are_the_issue_s_levels_and_every_side() -> None:
    args = generate.parse_args([])
    assert args.clients == [1, 8, 32]
    assert args.sides == list(generate.SIDES)
    assert [generate.requests_for(args, n) for n in (1, 8, 32)] == [16, 16, 64]
    fixed = generate.parse_args(["--requests", "5", "--clients", "2,4", "--sides", "static"])
    assert (fixed.clients, fixed.sides, generate.requests_for(fixed, 4)) == ([2, 4], ["static"], 5)
    one_round = generate.parse_args(["--min-requests", "8", "--rounds", "1"])
    assert [generate.requests_for(one_round, n) for n in (1, 8, 32)] == [8, 8, 32]


def test_flotilla_serves_the_model_s_fleet_entry_unless_told_another() -> None:
    default = generate.flotilla_config(generate.parse_args(["--threads", "3"]))
    assert (default.model, default.fleet, default.threads) == ("smollm2-135m-instruct", None, 3)
    named = generate.parse_args(["--flotilla-model", "chat", "--flotilla-fleet", "f.yaml"])
    assert (generate.flotilla_config(named).model, named.flotilla_fleet) == ("chat", Path("f.yaml"))


@pytest.mark.parametrize(
    "argv",
    [
        ["--clients", "0,8"],
        ["--clients", "a"],
        ["--sides", "vllm"],
        ["--sides", ""],
        ["--requests", "0"],
        ["--rounds", "0"],
        ["--min-requests", "-1"],
        ["--threads", "0"],
    ],
)
def test_bad_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        generate.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_the_baseline_server_s_model_names_pick_the_batch_size() -> None:
    assert local.batch_size_of(local.ONE_AT_A_TIME) == 1
    assert local.batch_size_of("static-32") == 32
    for bad in ("static-0", "static-", "static-x", "smollm2", ""):
        with pytest.raises(ValueError, match="one-at-a-time"):
            local.batch_size_of(bad)


def test_same_text_compares_the_same_request_index() -> None:
    def stream(text: str, ok: bool = True) -> Stream:
        return Stream(0, 1, 200, None if ok else "x", (0.5,), text, 1, 1)

    reference = [stream("a"), stream("b"), stream("c")]
    assert generate.same_text_share([stream("a"), stream("x"), stream("c")], reference) == 2 / 3
    assert generate.same_text_share([stream("a"), stream("b", ok=False)], reference) == 1.0
    assert generate.same_text_share([], reference) is None


def _side(model: str | None, fleet: Path | None = None) -> flotilla_side.FlotillaSide:
    return flotilla_side.FlotillaSide(model, fleet, threads=2, ready_timeout_s=1, timeout_s=60)


def test_the_flotilla_side_is_skipped_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "fleet.yaml"
    assert "--flotilla-model" in (flotilla_side.fleet_file(_side(None), out) or "")
    unknown = flotilla_side.fleet_file(_side("no-such-model"), out) or ""
    assert "no-such-model" in unknown and "all-minilm-l6-v2" in unknown  # lists the fleet
    embedder = flotilla_side.fleet_file(_side("all-minilm-l6-v2"), out) or ""
    assert "task embed, not generate" in embedder
    assert not out.exists()
    with (
        pytest.raises(flotilla_side.SkipSide, match="--flotilla-model"),
        flotilla_side.serve(_side(None), tmp_path / "flotilla.log"),
    ):
        pass


def test_a_generation_entry_is_written_as_a_one_model_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The generation task is another branch's; a stand-in spec with task
    # 'generate' checks that the entry is written alone, by its name.
    class Spec:
        name = "chat"
        task = "generate"

        def model_dump(self, **kwargs: object) -> dict[str, object]:
            return {"source": {"path": "/models/chat"}, "task": "generate"}

    class Fleet:
        def get(self, name: str) -> Spec:
            assert name == "chat"
            return Spec()

    monkeypatch.setattr("embedder.core.fleet.load_fleet", lambda path: Fleet())
    out = tmp_path / "fleet.yaml"
    assert flotilla_side.fleet_file(_side("chat"), out) is None
    assert yaml.safe_load(out.read_text()) == {
        "models": {"chat": {"source": {"path": "/models/chat"}, "task": "generate"}}
    }
