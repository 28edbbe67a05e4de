"""A machine flotilla has no tuned profile for, as a new user meets it.

``flotilla serve`` starts on one model with the shipped profiles hidden (an empty
``--tuned-file``) and an empty cache (``--model-cache-dir`` in a fresh folder), so it has
no exports, no tuned profile and nothing borrowed. Closed-loop clients load it from its
first answer, window after window, while it tunes in the background and moves to what
it chose; every answer is counted, so a request lost or late during the switch shows.

Then, beside it, the same model as ``flotilla tune`` (the full search) followed by a
restart serves it: both servers are loaded in turn, order alternating each round, and
the ratio of their tokens/s is the first start's against the full tune's. Last, the
first server restarts on the same cache, and the benchmark records how long it took to
report ready and with which profile (``cached``: tuned from its first request).

``--cpus 0`` pins both servers and the tune to those cores (``taskset``), a device whose
fingerprint no tuned file has either; the load generator then runs beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench import report, texts
from bench.load import HOST, Level, Plan, free_port, plan_requests, run_level
from bench.served import one_model_fleet, server
from embedder.core.fleet import entry_as
from embedder.tasks.embed.spec import EncoderSpec

SETTLED = frozenset({"tuned", "cached", "fleet", "quick", "borrowed"})


@dataclass
class Window:
    """One window of load on the first start: what was served, and the profile after."""

    at_s: float  # since the server was started
    level: Level
    source: str
    runtime: str
    why: str

    def row(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at_s, 1),
            "tokens_per_s": self.level.tokens / self.level.elapsed_s,
            "ok": self.level.ok,
            "errors": dict(self.level.errors),
            "p99_ms": report.percentile([s * 1e3 for s in self.level.latencies_s], 99),
            "source": self.source,
            "runtime": self.runtime,
            "why": self.why,
        }


@dataclass
class Paired:
    first: list[float] = field(default_factory=list)  # tokens/s per round
    tuned: list[float] = field(default_factory=list)
    errors: int = 0
    profiles: list[dict[str, str]] = field(default_factory=list)  # first start, full tune

    def ratio(self) -> float:
        return statistics.median(a / b for a, b in zip(self.first, self.tuned, strict=True))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.first_start",
        description="A first start with no tuned profile, against `flotilla tune` + restart.",
    )
    p.add_argument("--model", default="all-minilm-l6-v2", help="a model of the bundled fleet")
    p.add_argument("--cpus", default=None, help="taskset CPU list for the servers and the tune")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--limit-s", type=float, default=300.0, help="the tune's time to settle")
    p.add_argument("--rounds", type=int, default=4, help="paired rounds against the full tune")
    p.add_argument("--round-s", type=float, default=15.0)
    p.add_argument("--tune-args", default="", help="extra `flotilla tune` arguments")
    p.add_argument("--n-texts", type=int, default=1000)
    p.add_argument("--seed", type=int, default=texts.SEED)
    p.add_argument("--ready-timeout-s", type=float, default=600.0)
    p.add_argument("--out", default="first_start")
    return p.parse_args(argv)


def _prefix(cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


def _threads(cpus: str | None) -> int:
    if not cpus:
        return os.cpu_count() or 1
    return len(os.sched_getaffinity(0) & _cpu_set(cpus))


def _cpu_set(cpus: str) -> set[int]:
    out: set[int] = set()
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


async def _profile(session: aiohttp.ClientSession, port: int, model: str) -> dict[str, str]:
    """The model's profile source, why, and runtime, as /v1/models says."""
    async with session.get(f"http://{HOST}:{port}/v1/models") as response:
        data = (await response.json())["data"]
    entry = next(m for m in data if m["id"] == model)
    profile = entry.get("profile") or {}
    return {
        "source": str(profile.get("source", "?")),
        "why": str(profile.get("why", "")),
        "runtime": str(entry.get("dtype", "?")),
    }


async def _windows(port: int, args: argparse.Namespace, plan: Plan, t0: float) -> list[Window]:
    """Load windows until the profile settles (one more window after), or the limit."""
    url = f"http://{HOST}:{port}/v1/embeddings"
    out: list[Window] = []
    settled_at: float | None = None
    async with _session(args.concurrency) as session:
        while time.perf_counter() - t0 < args.limit_s + args.window_s:
            level = Level(concurrency=args.concurrency)
            offset = sum(w.level.sent for w in out)
            await run_level(session, url, plan, level, args.window_s, 10**6, offset)
            seen = await _profile(session, port, args.model)
            at = time.perf_counter() - t0
            out.append(Window(at, level, seen["source"], seen["runtime"], seen["why"]))
            print(_window_line(out[-1]))
            if seen["source"] in SETTLED and settled_at is None:
                settled_at = out[-1].at_s
            elif settled_at is not None:
                break
    return out


def _window_line(w: Window) -> str:
    row = w.row()
    return (
        f"  {row['at_s']:6.1f} s  {row['tokens_per_s']:8,.0f} tok/s  p99 {row['p99_ms']:6.0f} ms"
        f"  errors {row['errors'] or 0}  profile {w.source}: {w.runtime}"
    )


def _session(concurrency: int) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=60)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency))


async def _paired(ports: tuple[int, int], args: argparse.Namespace, plan: Plan) -> Paired:
    """Rounds of load on each server in turn, the order alternating each round."""
    paired = Paired()
    async with _session(args.concurrency) as session:
        paired.profiles = [await _profile(session, port, args.model) for port in ports]
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            rates: dict[int, float] = {}
            for side in order:
                url = f"http://{HOST}:{ports[side]}/v1/embeddings"
                level = Level(concurrency=args.concurrency)
                await run_level(session, url, plan, level, args.round_s, 10**6, r * 5000)
                rates[side] = level.tokens / level.elapsed_s
                paired.errors += sum(level.errors.values())
            paired.first.append(rates[0])
            paired.tuned.append(rates[1])
            print(f"  round {r + 1}: first start {rates[0]:,.0f}, full tune {rates[1]:,.0f} tok/s")
    return paired


def _tune(args: argparse.Namespace, env: dict[str, str], fleet: Path, out: Path) -> float:
    command = [
        *_prefix(args.cpus),
        sys.executable,
        "-m",
        "flotilla",
        "tune",
        args.model,
        "--fleet",
        str(fleet),
        "--out",
        str(out),
        "--results",
        str(out.parent / "tune-results"),
        *args.tune_args.split(),
    ]
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    return time.perf_counter() - started


def _serve(
    port: int, args: argparse.Namespace, log: Path, fleet: Path, env: dict[str, str]
) -> contextlib.AbstractContextManager[int]:
    return server(
        port,
        _threads(args.cpus),
        log,
        args.ready_timeout_s,
        fleet,
        "cpu",
        env,
        prefix=_prefix(args.cpus),
        log_level="info",
    )


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from embedder.tasks.fleet import load_fleet

    spec = entry_as(load_fleet().get(args.model), EncoderSpec)
    fleet = work / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(one_model_fleet(spec)), encoding="utf-8")
    empty = work / "empty-tuned.yaml"
    empty.write_text("", encoding="utf-8")
    first_env = {
        "FLOTILLA_TUNED_FILE": str(empty),
        "FLOTILLA_MODEL_CACHE_DIR": str(work / "cache"),
    }
    corpus = texts.build(args.n_texts, args.seed)
    plan = plan_requests(corpus, spec.name, spec.max_tokens, 20000, args.seed, "base64")
    result: dict[str, Any] = {"benchmark": "first_start", "model": spec.name}
    ports = (free_port(), free_port())
    print(f"first start, no tuned profile, empty cache ({work})")
    t0 = time.perf_counter()
    with _serve(ports[0], args, work / "first.log", fleet, first_env):
        result["first_ready_s"] = time.perf_counter() - t0
        print(f"  ready after {result['first_ready_s']:.1f} s")
        windows = asyncio.run(_windows(ports[0], args, plan, t0))
        result["windows"] = [w.row() for w in windows]
        tuned = work / "full-tuned.yaml"
        print("flotilla tune (the full search), the first server idle beside it")
        # Its own cache: `flotilla tune` keeps its result there too, and the first start's
        # restart below must find what the background tune kept.
        apart = {"FLOTILLA_TUNED_FILE": str(tuned), "FLOTILLA_MODEL_CACHE_DIR": str(work / "c2")}
        result["full_tune_s"] = _tune(args, {**os.environ, **apart}, fleet, tuned)
        tuned_env = {**first_env, **apart}
        with _serve(ports[1], args, work / "tuned.log", fleet, tuned_env):
            print("paired: the first start against `flotilla tune` + restart")
            paired = asyncio.run(_paired(ports, args, plan))
    result["paired"] = {
        "first_tokens_per_s": paired.first,
        "full_tune_tokens_per_s": paired.tuned,
        "errors": paired.errors,
        "ratio_median": paired.ratio(),
        "profiles": paired.profiles,
    }
    result["second_start"] = _second_start(args, work, fleet, first_env)
    return result


def _second_start(
    args: argparse.Namespace, work: Path, fleet: Path, env: dict[str, str]
) -> dict[str, Any]:
    """The first server again on the same cache: ready after how long, with what."""
    port = free_port()
    t0 = time.perf_counter()
    with _serve(port, args, work / "second.log", fleet, env):
        ready_s = time.perf_counter() - t0

        async def profile() -> dict[str, str]:
            async with _session(1) as session:
                return await _profile(session, port, args.model)

        seen = asyncio.run(profile())
    print(f"second start: ready after {ready_s:.1f} s, profile {seen['source']}: {seen['why']}")
    return {"ready_s": ready_s, **seen}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="flotilla-first-start-"))
    try:
        result = run(args, work)
    finally:
        logs = report.results_dir() / f"{args.out}-logs"
        logs.mkdir(exist_ok=True)
        for log in work.glob("*.log"):
            shutil.copy(log, logs / log.name)
        shutil.rmtree(work, ignore_errors=True)
    result["machine"] = report.machine(_threads(args.cpus))
    result["args"] = json.loads(json.dumps(vars(args), default=str))
    _summary(result)
    path = report.write_json(f"{args.out}.json", result)
    print(f"wrote {path}")
    return result


def _summary(result: dict[str, Any]) -> None:
    windows = result["windows"]
    errors = sum(sum(w["errors"].values()) for w in windows)
    answered = sum(w["ok"] for w in windows)
    settled = next((w for w in windows if w["source"] in SETTLED), None)
    cores = result["args"]["cpus"] or "all"
    print(f"\n{result['model']} on {result['machine']['cpu']}, cores {cores}")
    print(
        f"  first start: ready after {result['first_ready_s']:.1f} s; {answered} answered, "
        f"{errors} failed while it tuned"
    )
    if settled is not None:
        print(
            f"  settled on {settled['runtime']} ({settled['source']}) after {settled['at_s']:.0f} s"
        )
    paired = result["paired"]
    print(
        f"  against `flotilla tune` + restart ({result['full_tune_s']:.0f} s of tuning): "
        f"{paired['ratio_median']:.2f}x, median of {len(paired['first_tokens_per_s'])} rounds"
    )
    for name, seen in zip(("first start", "full tune"), paired["profiles"], strict=False):
        print(f"    {name}: {seen['why']}")
    second = result["second_start"]
    print(f"  second start: ready after {second['ready_s']:.1f} s on {second['source']}")


if __name__ == "__main__":
    main()
