"""The cost model of the cluster simulation, measured on the real worker runtime.

``python -m bench.cluster.calibrate`` loads the fleet's all-MiniLM-L6-v2 with the
real torch runtime (cpu profile), times ``forward`` on batches of real text
(``bench.texts``) of varying total tokens and sequence counts, and fits
``bench.cluster.cost_model``'s line

    batch_s = fixed_s + per_token_s * padded_tokens

by least squares. The fit goes to ``bench/results/cluster_calibration.json``,
which the simulation reads (``cost_model.load_cost``).

This module imports torch only inside ``measure``: its fit is testable without it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from bench import report
from bench.cluster.cost_model import MODEL, RESULT, load_cost, padded_tokens

# Batch sizes to time, in tokens: from one short input to a full cpu batch (8192).
TARGET_TOKENS = (16, 64, 256, 512, 1024, 2048, 4096, 8192)
# wall: elapsed time. cpu: the process's CPU time, which a busy shared machine does not
# inflate as long as the runtime has one thread (more threads spin-wait for each other).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
KINDS: dict[str, tuple[int, int]] = {  # tokens per input, [CLS] and [SEP] included
    "short": (1, 32),
    "medium": (33, 128),
    "long": (129, 256),
    "mixed": (1, 256),
}


def fit_line(
    xs: Sequence[float], ys: Sequence[float], relative: bool = True
) -> tuple[float, float, float]:
    """Least squares ``y = a + b x``: (a, b, r²). ``relative`` weighs each point by
    1/y, minimizing relative errors: otherwise the largest batches decide the fit and
    the fixed cost, which is what small batches pay, comes out wrong."""
    import numpy as np

    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    weight = 1.0 / y if relative else np.ones_like(y)
    design = np.stack([np.ones_like(x), x], axis=1) * weight[:, None]
    (a, b), *_ = np.linalg.lstsq(design, y * weight, rcond=None)
    residual = y - (a + b * x)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    return float(a), float(b), r2


def _batches(lengths: Sequence[int], seed: int) -> list[tuple[str, int, list[int]]]:
    """(kind, target tokens, text indices) for every kind and target: texts of that
    kind drawn at random until one more would pass the target."""
    rng = random.Random(seed)
    out: list[tuple[str, int, list[int]]] = []
    for kind, (low, high) in KINDS.items():
        pool = [i for i, n in enumerate(lengths) if low <= n <= high]
        for target in TARGET_TOKENS:
            rng.shuffle(pool)
            chosen: list[int] = []
            tokens = 0
            for i in pool:
                if chosen and tokens + lengths[i] > target:
                    continue
                chosen.append(i)
                tokens += lengths[i]
                if tokens >= target * 0.97:
                    break
            out.append((kind, target, chosen))
    return out


def measure(
    n_texts: int,
    reps: int,
    threads: int,
    seed: int,
    dtype: str | None = None,
    clock: str = "wall",
) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from bench import texts
    from embedder.tasks.fleet import load_fleet
    from embedder.tasks.embed.runtimes import Encoded, load_runtime

    spec = load_fleet().get(MODEL)
    if dtype is not None:  # the cpu profile says "auto", which a busy machine can mislead
        cpu = spec.profile("cpu").model_copy(update={"dtype": dtype})
        spec = spec.model_copy(update={"profiles": {**spec.profiles, "cpu": cpu}})
    profile = spec.profile("cpu")
    runtime = load_runtime(spec, "cpu", threads)
    corpus = texts.build(n_texts, seed)
    encoded = runtime.tokenize(corpus.texts, "right")
    lengths = [len(ids) for ids in encoded.ids]  # after truncation to the model's limit
    plan = _batches(lengths, seed)

    def subset(rows: list[int]) -> Encoded:
        types = encoded.type_ids
        return Encoded(
            ids=[encoded.ids[i] for i in rows],
            type_ids=[types[i] for i in rows] if types is not None else None,
            full_lengths=[encoded.full_lengths[i] for i in rows],
        )

    batches = [subset(rows) for _, _, rows in plan]
    for batch in batches[:: max(1, len(batches) // 6)]:  # warm up kernels and caches
        runtime.forward(batch)
    seconds: list[list[float]] = [[] for _ in batches]
    others: list[list[float]] = [[] for _ in batches]
    order = list(range(len(batches)))
    rng = random.Random(seed)
    now = CLOCKS[clock]
    meter = report.CpuMeter()
    for rep in range(reps):
        rng.shuffle(order)  # a slow spell of a shared machine hits every batch alike
        for b in order:
            sample = report.CpuMeter()
            start = now()
            runtime.forward(batches[b])
            seconds[b].append(now() - start)
            others[b].append(sample.result().get("others_share", 0.0))
        print(f"  rep {rep + 1}/{reps} done")
    points: list[dict[str, Any]] = []
    for (kind, target, rows), batch, secs, noise in zip(
        plan, batches, seconds, others, strict=True
    ):
        batch_lengths = [len(ids) for ids in batch.ids]
        points.append(
            {
                "kind": kind,
                "target_tokens": target,
                "sequences": len(rows),
                "tokens": sum(batch_lengths),
                "padded_tokens": padded_tokens(
                    batch_lengths, profile.forward_tokens, profile.forward_max_sequences
                ),
                "passes": _passes(
                    batch_lengths, profile.forward_tokens, profile.forward_max_sequences
                ),
                "median_s": statistics.median(secs),
                "min_s": min(secs),
                "others_share_median": statistics.median(noise),
            }
        )
    # The fastest of the repetitions: other tenants of a shared machine only ever slow a
    # run down, so the minimum is the least disturbed estimate of the batch's own cost.
    xs, ys = [p["padded_tokens"] for p in points], [p["min_s"] for p in points]
    fixed_s, per_token_s, r2 = fit_line(xs, ys)
    plain = fit_line(xs, ys, relative=False)
    for p in points:
        model_s = fixed_s + per_token_s * p["padded_tokens"]
        p["fit_s"] = model_s
        p["relative_error"] = (model_s - p["min_s"]) / p["min_s"]
    return {
        "benchmark": "cluster_calibration",
        "model": MODEL,
        "device": "cpu",
        "dtype": runtime.info.dtype,
        "machine": report.machine(threads),
        "args": {
            "n_texts": n_texts,
            "reps": reps,
            "threads": threads,
            "seed": seed,
            "dtype": dtype or profile.dtype,
            "clock": clock,
        },
        "profile": profile.model_dump(),
        "fit": {
            "formula": "batch_s = fixed_s + per_token_s * padded_tokens",
            "fitted_to": "each batch's fastest of the repetitions (min_s), weighted by 1/min_s",
            "fixed_s": fixed_s,
            "per_token_s": per_token_s,
            "r2": r2,
            "tokens_per_s_full_batch": profile.max_batch_tokens
            / (fixed_s + per_token_s * profile.max_batch_tokens),
            "max_abs_relative_error": max(abs(p["relative_error"]) for p in points),
            "unweighted": {"fixed_s": plain[0], "per_token_s": plain[1], "r2": plain[2]},
        },
        "cpu_during_measurement": meter.result(),
        "points": points,
    }


def _passes(lengths: Sequence[int], max_tokens: int, max_sequences: int) -> int:
    passes = count = 0
    for n in sorted(lengths):
        if count and ((count + 1) * n > max_tokens or count >= max_sequences):
            passes += 1
            count = 0
        count += 1
    return passes + (1 if count else 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster.calibrate",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--n-texts", type=int, default=1500)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="override the cpu profile's dtype (default: the profile's, 'auto')",
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or CPU time (robust on a busy machine; use with --threads 1)",
    )
    args = parser.parse_args(argv)
    data = measure(args.n_texts, args.reps, args.threads, args.seed, args.dtype, args.clock)
    path = report.write_json(RESULT, data)
    fit = data["fit"]
    print(
        report.table(
            [
                "kind",
                "target",
                "seqs",
                "tokens",
                "padded",
                "passes",
                "min ms",
                "median ms",
                "fit ms",
            ],
            [
                [
                    p["kind"],
                    p["target_tokens"],
                    p["sequences"],
                    p["tokens"],
                    p["padded_tokens"],
                    p["passes"],
                    1e3 * p["min_s"],
                    1e3 * p["median_s"],
                    1e3 * p["fit_s"],
                ]
                for p in data["points"]
            ],
        )
    )
    print(
        f"\nbatch_s = {1e3 * fit['fixed_s']:.2f} ms + {1e6 * fit['per_token_s']:.2f} µs × "
        f"padded tokens (r² {fit['r2']:.4f}, worst relative error "
        f"{100 * fit['max_abs_relative_error']:.0f}%); a full batch runs "
        f"{fit['tokens_per_s_full_batch']:,.0f} tokens/s\nwrote {path}"
    )
    print(json.dumps(asdict(load_cost(path)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
