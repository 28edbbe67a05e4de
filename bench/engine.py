"""Engine benchmark: flotilla's runtime against ``SentenceTransformer.encode``.

Both run in this one process, on the same texts (``bench.texts``), with the
same thread count. Measured, per method, from strings to vectors:

- ``st-fp32``: ``SentenceTransformer(path).encode(texts, batch_size=32)``, its
  defaults (fp32; it sorts each call's texts by length and pads per batch);
- ``flotilla``: ``load_runtime(spec, device, threads)`` with the fleet's profile
  for the device (``dtype: auto`` picks bf16 autocast or fp32 at load), ``tokenize``
  then ``forward`` (length-sorted passes of at most ``forward_tokens`` padded tokens);
- ``st-bf16``: ST.encode with its model cast to bf16, the in-process ceiling;
- ``RUNTIME-DTYPE``: every registered runtime at every precision it offers
  (``bench.candidates``; one that refuses to load is skipped with its reason),
  ``profile`` (``--profile FILE``) and ``tuned`` (the tuned profile, if any).

Tokens are real tokens: ``[CLS]``/``[SEP]`` included, padding excluded, each
input counted after truncation to the model's limit (256), the same count for
every method. The texts are cut into chunks; every repetition runs every
chunk through every method, rotating the order per chunk, so a slow spell of
a shared machine hits all methods alike. Reported: the median over
repetitions of tokens/s, and the median of per-chunk paired speed-ups against
ST. Accuracy: cosine of each method's normalized vectors to ST's fp32 vectors.

    python -m bench.engine [--n-texts 800] [--reps 3] [--threads N] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench import report, texts
from bench.candidates import (
    load_each,
    profile_candidate,
    runtime_candidates,
    tuned_candidate,
    with_profile,
)
from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.tasks.embed.spec import EncoderProfile
from embedder.tasks.fleet import load_fleet
from embedder.tasks.embed.runtimes import Runtime, load_runtime

Vectors = NDArray[np.float32]
TARGET_SPEEDUP = 2.0
TARGET_COSINE = 0.999
REFERENCE = "st-fp32"
QUIET = 0.10  # a sample is quiet when other processes used at most this share of the CPU


@dataclass
class Method:
    key: str
    label: str
    dtype: str
    encode: Callable[[Sequence[str]], Vectors]  # strings -> unit vectors
    phases: dict[str, float] = field(default_factory=dict)  # seconds, summed over all calls
    same_as: str | None = None  # a row not run separately: it is this method's config


def _unit(vectors: Vectors) -> Vectors:
    norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    unit: Vectors = (vectors / norms).astype(np.float32)
    return unit


def st_method(key: str, label: str, model: Any, batch_size: int, dtype: str) -> Method:
    def encode(batch: Sequence[str]) -> Vectors:
        out = model.encode(
            list(batch), batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False
        )
        return _unit(out.float().cpu().numpy())

    return Method(key, label, dtype, encode)


def flotilla_method(key: str, label: str, runtime: Runtime) -> Method:
    phases = {"tokenize": 0.0, "forward": 0.0}

    def encode(batch: Sequence[str]) -> Vectors:
        start = time.perf_counter()
        encoded = runtime.tokenize(batch, "right")
        middle = time.perf_counter()
        out = runtime.forward(encoded)
        phases["tokenize"] += middle - start
        phases["forward"] += time.perf_counter() - middle
        return _unit(out)

    return Method(key, label, runtime.info.dtype, encode, phases)


def _precision(dtype: str) -> str:
    """'bfloat16' for bf16 weights or bf16 autocast over fp32 weights, else the dtype."""
    return "bfloat16" if dtype.startswith("bfloat16") else dtype


def candidate_methods(
    spec: ModelSpec, device: DeviceKind, args: argparse.Namespace, default: tuple[str, str]
) -> tuple[list[Method], list[tuple[str, str]]]:
    """Every runtime x precision (from the registries), the ``--profile`` file and the
    tuned profile, each loaded; one that refuses to load is skipped with its reason. A
    candidate that loads as the default's (runtime, dtype) is marked ``= flotilla``."""
    from embedder.tasks.embed.runtimes import RUNTIMES

    candidates = runtime_candidates(spec, device, RUNTIMES, only=args.runtimes)
    if args.profile is not None:
        candidates.append(profile_candidate(spec, device, args.profile))
    tuned = tuned_candidate(spec, device)
    if isinstance(tuned, str):
        unloaded = [("tuned", tuned)]
    else:
        candidates.append(tuned)
        unloaded = []
    loaded, skipped = load_each(
        candidates, lambda candidate: load_runtime(candidate, device, args.threads)
    )
    skipped = unloaded + skipped
    for key, reason in skipped:
        print(f"skipping {key}: {reason}")
    methods: list[Method] = []
    for candidate, runtime in loaded:
        same = (candidate.spec.profile(device).runtime, runtime.info.dtype) == default
        if same and candidate.key not in ("profile", "tuned"):
            # The default profile already runs this configuration: one row, not two runs.
            methods.append(
                Method(
                    candidate.key, candidate.label, runtime.info.dtype, _unused, same_as="flotilla"
                )
            )
        else:
            methods.append(flotilla_method(candidate.key, candidate.label, runtime))
    return methods, skipped


def _unused(batch: Sequence[str]) -> Vectors:
    raise AssertionError("a row marked same_as is never run")


def padded_tokens_st(lengths: Sequence[int], text_lengths: Sequence[int], batch_size: int) -> int:
    """Tokens ST.encode runs, padding included: it sorts a call's texts by character
    length (longest first) and pads each batch to its longest input."""
    order = sorted(range(len(lengths)), key=lambda i: -text_lengths[i])
    total = 0
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        total += len(rows) * max(lengths[i] for i in rows)
    return total


def padded_tokens_flotilla(lengths: Sequence[int], profile: EncoderProfile) -> int:
    from embedder.tasks.embed.batching import micro_batches

    passes = micro_batches(lengths, profile.forward_tokens, profile.forward_max_sequences)
    return sum(len(rows) * max(lengths[i] for i in rows) for rows in passes)


@dataclass
class Samples:
    """Per method: seconds[rep][chunk], and the share of the machine's CPU that other
    processes used meanwhile (a shared machine's noise, recorded with each sample)."""

    seconds: dict[str, list[list[float]]]
    others: dict[str, list[list[float]]]
    vectors: dict[str, Vectors]  # each method's output, from the last repetition

    def pairs(self, key: str, quiet: float | None = None) -> list[float]:
        """ST's time over ``key``'s time, chunk by chunk (the two ran back to back);
        with ``quiet``, only pairs during which others used at most that CPU share."""
        return [
            st_s / own_s
            for r, (st_rep, own_rep) in enumerate(
                zip(self.seconds[REFERENCE], self.seconds[key], strict=True)
            )
            for c, (st_s, own_s) in enumerate(zip(st_rep, own_rep, strict=True))
            if quiet is None or max(self.others[REFERENCE][r][c], self.others[key][r][c]) <= quiet
        ]


def measure(
    methods: Sequence[Method], chunks: Sequence[Sequence[str]], reps: int, wait_quiet_s: float
) -> Samples:
    """Every repetition runs every chunk through every method, rotating their order."""
    seconds = {m.key: [[0.0] * len(chunks) for _ in range(reps)] for m in methods}
    others = {m.key: [[0.0] * len(chunks) for _ in range(reps)] for m in methods}
    outputs: dict[str, list[Vectors]] = {m.key: [] for m in methods}
    step = 0
    for rep in range(reps):
        if wait_quiet_s > 0:
            report.wait_for_quiet(wait_quiet_s)
        for c, chunk in enumerate(chunks):
            shift = step % len(methods)
            step += 1
            for method in [*methods[shift:], *methods[:shift]]:
                meter = report.CpuMeter()
                start = time.perf_counter()
                vectors = method.encode(chunk)
                seconds[method.key][rep][c] = time.perf_counter() - start
                others[method.key][rep][c] = meter.result().get("others_share", 0.0)
                if rep == reps - 1:
                    outputs[method.key].append(vectors)
        done = {m.key: sum(seconds[m.key][rep]) for m in methods}
        busy = report.median([o for m in methods for o in others[m.key][rep]])
        print(
            f"  rep {rep + 1}/{reps}: "
            + ", ".join(f"{k} {s:.1f}s" for k, s in done.items())
            + f" (other processes: {100 * busy:.0f}% of the CPU)"
        )
    return Samples(seconds, others, {k: np.concatenate(v) for k, v in outputs.items()})


def plot(rows: Sequence[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(r["method"]) + (f"\n(= {r['same_as']})" if r["same_as"] else "") for r in rows]
    values = [float(r["tokens_per_s"]) for r in rows]
    colors = ["#888888" if str(r["method"]).startswith("st") else "#1f77b4" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.bar(labels, values, color=colors)
    for bar, row in zip(bars, rows, strict=True):
        ax.annotate(
            f"{float(row['tokens_per_s']):,.0f}\n×{float(row['speedup_vs_st']):.2f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylabel("real tokens/s (padding excluded)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(0, max(values) * 1.25)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine",
        description="flotilla's runtime against SentenceTransformer.encode, same process, "
        "same texts.",
    )
    parser.add_argument("--n-texts", type=int, default=800, help="passages in the corpus")
    parser.add_argument("--reps", type=int, default=3, help="measured repetitions")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch CPU threads"
    )
    parser.add_argument(
        "--chunk", type=int, default=200, help="texts per call; methods alternate per chunk"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="ST.encode batch_size")
    parser.add_argument("--warmup-texts", type=int, default=200, help="texts per warm-up call")
    parser.add_argument("--seed", type=int, default=texts.SEED)
    parser.add_argument(
        "--forward-tokens", type=int, default=None, help="override the cpu profile's knob"
    )
    parser.add_argument(
        "--forward-max-sequences", type=int, default=None, help="override the cpu profile's knob"
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where every method runs"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a YAML or JSON file of profile fields: a row running them over the fleet's profile",
    )
    parser.add_argument(
        "--runtimes",
        type=lambda v: [r for r in v.split(",") if r],
        default=None,
        help="comma-separated runtimes for the runtime x precision rows (default: every one "
        "registered)",
    )
    parser.add_argument(
        "--no-ablation",
        action="store_true",
        help="only ST.encode and flotilla's default: no st-bf16, runtime, profile or tuned rows",
    )
    parser.add_argument(
        "--wait-quiet-s",
        type=float,
        default=0.0,
        help="on a shared machine, wait up to this long for other processes to go quiet",
    )
    parser.add_argument("--out", default="engine", help="results file stem in bench/results/")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("embedder").setLevel(logging.INFO)  # the dtype choice at load
    import torch
    from sentence_transformers import SentenceTransformer

    from embedder.tasks.embed.runtimes.torch_st import cpu_has_bf16

    torch.set_num_threads(args.threads)
    device: DeviceKind = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    fleet = load_fleet()
    spec = fleet.get(fleet.default_model)
    knobs: dict[str, object] = {}
    if args.forward_tokens is not None:
        knobs["forward_tokens"] = args.forward_tokens
    if args.forward_max_sequences is not None:
        knobs["forward_max_sequences"] = args.forward_max_sequences
    spec = with_profile(spec, device, **knobs) if knobs else spec
    profile = spec.profile(device)
    path = str(spec.source.resolve())

    corpus = texts.build(args.n_texts, args.seed)
    warmup = texts.build(args.warmup_texts, args.seed + 7).texts

    print(f"loading {spec.name} from {path} ({args.threads} threads)")
    st = SentenceTransformer(path, device=device)
    runtime = load_runtime(spec, device, args.threads)
    max_tokens = runtime.info.max_tokens
    if st.max_seq_length != max_tokens:
        raise SystemExit(f"ST truncates at {st.max_seq_length}, flotilla at {max_tokens}")
    default_dtype = runtime.info.dtype
    auto = profile.dtype == "auto"
    if device == "cpu" and auto and _precision(default_dtype) == "float32" and cpu_has_bf16():
        print("note: dtype auto chose fp32 on a CPU with native bf16: a busy machine?")
    methods = [
        st_method("st-fp32", "SentenceTransformer.encode (fp32)", st, args.batch_size, "float32"),
        flotilla_method(
            "flotilla", f"flotilla default profile ({profile.runtime}, {default_dtype})", runtime
        ),
    ]
    ablations: list[Method] = []
    skipped_rows: list[tuple[str, str]] = []
    if not args.no_ablation:
        ablations.append(
            st_method(
                "st-bf16",
                "ST.encode, model cast to bf16 (the in-process ceiling)",
                SentenceTransformer(path, device=device).to(torch.bfloat16),
                args.batch_size,
                "bfloat16",
            )
        )
        rows_of, skipped_rows = candidate_methods(
            spec, device, args, (profile.runtime, default_dtype)
        )
        ablations += rows_of
    torch.set_num_threads(args.threads)  # loading may have changed it
    run = [m for m in (*methods, *ablations) if m.same_as is None]

    chunks = [corpus.texts[i : i + args.chunk] for i in range(0, len(corpus.texts), args.chunk)]
    chunk_lengths = [
        [min(n, max_tokens) for n in runtime.tokenize(c, "right").full_lengths] for c in chunks
    ]
    lengths = [n for c in chunk_lengths for n in c]
    tokens = sum(lengths)
    assert tokens == sum(corpus.truncated_lengths(max_tokens))
    padded_st = sum(
        padded_tokens_st(ls, [len(t) for t in c], args.batch_size)
        for ls, c in zip(chunk_lengths, chunks, strict=True)
    )
    padded_fl = sum(padded_tokens_flotilla(ls, profile) for ls in chunk_lengths)
    stats = texts.describe(corpus.lengths)
    print(
        f"{len(corpus.texts)} texts, {tokens:,} tokens after truncation to {max_tokens} "
        f"(lengths before: min {stats['min']:.0f}, p50 {stats['p50']:.0f}, "
        f"max {stats['max']:.0f}); {len(chunks)} chunks of {args.chunk}"
    )

    print(f"warming up on {len(warmup)} other texts")
    for method in run:
        method.encode(warmup)
    for method in run:
        for phase in method.phases:
            method.phases[phase] = 0.0
    print(f"measuring {args.reps} repetitions, methods alternating per chunk")
    meter = report.CpuMeter()
    samples = measure(run, chunks, args.reps, args.wait_quiet_s)
    cpu = meter.result()

    def rates(key: str) -> list[float]:
        return [tokens / sum(rep) for rep in samples.seconds[key]]

    reference = samples.vectors[REFERENCE]
    st_rate = report.median(rates(REFERENCE))
    rows: list[dict[str, Any]] = []
    for method in (*methods, *ablations):
        key = method.same_as or method.key
        seconds = samples.seconds[key]
        best = tokens / sum(min(chunk) for chunk in zip(*seconds, strict=True))
        paired = samples.pairs(key)
        quiet = samples.pairs(key, QUIET)
        cosines = (samples.vectors[key] * reference).sum(axis=1)
        phases = next(m.phases for m in run if m.key == key)
        phase_total = sum(phases.values())
        rows.append(
            {
                "method": method.key,
                "label": method.label,
                "dtype": method.dtype,
                "same_as": method.same_as,
                "tokens_per_s": report.median(rates(key)),
                "tokens_per_s_reps": rates(key),
                "tokens_per_s_best": best,
                "speedup_vs_st": report.median(rates(key)) / st_rate,
                "paired_speedup_median": report.median(paired),
                "paired_speedup_range": [min(paired), max(paired)],
                "quiet_paired_speedup_median": report.median(quiet),
                "quiet_pairs": len(quiet),
                "pairs": len(paired),
                "worst_cosine": float(cosines.min()),
                "mean_cosine": float(cosines.mean()),
                "tokenize_share": phases["tokenize"] / phase_total if phase_total else None,
                "others_cpu_share_median": report.median(
                    [o for r in samples.others[key] for o in r]
                ),
            }
        )

    padding = {
        "st_padded_tokens": padded_st,
        "flotilla_padded_tokens": padded_fl,
        "st_padding_overhead": padded_st / tokens - 1,
        "flotilla_padding_overhead": padded_fl / tokens - 1,
    }
    main_row = rows[1]
    # On a shared machine the paired per-chunk ratio is the robust statistic: the two
    # methods ran back to back on the same texts. Quiet pairs are preferred when there
    # are enough of them.
    use_quiet = main_row["quiet_pairs"] >= max(3, main_row["pairs"] // 4)
    judged = main_row["quiet_paired_speedup_median" if use_quiet else "paired_speedup_median"]
    verdict = {
        "speedup_ratio_of_medians": main_row["speedup_vs_st"],
        "speedup_paired_median": main_row["paired_speedup_median"],
        "speedup_quiet_paired_median": main_row["quiet_paired_speedup_median"],
        "speedup_best_of": main_row["tokens_per_s_best"] / rows[0]["tokens_per_s_best"],
        "speedup_judged": judged,
        "judged_on": f"{'quiet ' if use_quiet else ''}paired per-chunk median",
        "worst_cosine": main_row["worst_cosine"],
        "meets_speedup": judged >= TARGET_SPEEDUP,
        "meets_cosine": main_row["worst_cosine"] >= TARGET_COSINE,
    }
    result: dict[str, Any] = {
        "benchmark": "engine",
        "model": spec.name,
        "machine": report.machine(args.threads),
        "args": json.loads(json.dumps(vars(args), default=str)),  # a --profile path: as text
        "profile": profile.model_dump(),
        "corpus": {
            "texts": len(corpus.texts),
            "tokens": tokens,
            "max_tokens": max_tokens,
            "lengths_before_truncation": stats,
            "chunks": len(chunks),
        },
        "padding": padding,
        "cpu_during_measurement": cpu,
        "rows": rows,
        "skipped_rows": [{"method": key, "reason": reason} for key, reason in skipped_rows],
        "verdict": verdict,
    }

    print()
    print(
        report.table(
            [
                "method",
                "dtype",
                "tokens/s",
                "x ST",
                "paired x ST",
                "quiet pairs",
                "best tok/s",
                "worst cos",
                "mean cos",
                "tokenize %",
            ],
            [
                [
                    r["method"] + (f" (= {r['same_as']})" if r["same_as"] else ""),
                    r["dtype"].replace(" (float32 weights)", ""),
                    r["tokens_per_s"],
                    r["speedup_vs_st"],
                    r["paired_speedup_median"],
                    f"{r['quiet_paired_speedup_median']:.2f} ({r['quiet_pairs']}/{r['pairs']})"
                    if r["quiet_pairs"]
                    else "-",
                    r["tokens_per_s_best"],
                    r["worst_cosine"],
                    r["mean_cosine"],
                    "-" if r["tokenize_share"] is None else f"{100 * r['tokenize_share']:.1f}",
                ]
                for r in rows
            ],
        )
    )
    print(
        f"\npadding overhead: ST.encode {100 * padding['st_padding_overhead']:.1f}%, "
        f"flotilla {100 * padding['flotilla_padding_overhead']:.1f}% "
        f"(forward_tokens {profile.forward_tokens}, "
        f"forward_max_sequences {profile.forward_max_sequences})"
    )
    print(
        f"CPU during the measurement: {100 * cpu.get('ours_share', 0):.0f}% ours, "
        f"{100 * cpu.get('others_share', 0):.0f}% other processes on this machine"
    )
    print(
        f"flotilla / ST.encode: ratio of medians {verdict['speedup_ratio_of_medians']:.2f}x, "
        f"paired per chunk {verdict['speedup_paired_median']:.2f}x, best-of "
        f"{verdict['speedup_best_of']:.2f}x; judged ({verdict['judged_on']}) "
        f"{verdict['speedup_judged']:.2f}x vs target {TARGET_SPEEDUP}x: "
        f"{'met' if verdict['meets_speedup'] else 'MISSED'}; worst cosine "
        f"{verdict['worst_cosine']:.5f} vs {TARGET_COSINE}: "
        f"{'met' if verdict['meets_cosine'] else 'MISSED'}"
    )
    json_path = report.write_json(f"{args.out}.json", result)
    png_path = report.results_dir() / f"{args.out}.png"
    machine = result["machine"]
    plot(
        rows,
        str(png_path),
        f"{spec.name}, {len(corpus.texts)} mixed texts, {tokens:,} tokens; "
        f"{machine['cpu']}, {args.threads} threads",
    )
    print(f"wrote {json_path} and {png_path}")
    return result


if __name__ == "__main__":
    main()
