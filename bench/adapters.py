"""Adapter benchmark: what serving LoRA adapters unmerged costs against the base model.

One process, the default fleet's model, the bench corpus (``bench.texts``), the
same threads and precision for every row. Two runtimes are loaded: one that has
never seen an adapter (the baseline), and one with ``--adapters`` random LoRA
adapters resident (rank ``--rank`` on ``--targets``). Per chunk of texts, rows:

- ``base``: the runtime without adapters;
- ``base, adapters resident``: base rows on the runtime that holds adapters (what
  adapter traffic costs the rest once any adapter is loaded);
- ``one adapter``: every row runs adapter 0;
- ``mixed``: rows cycle over all adapters within each forward pass (peft's
  per-row ``adapter_names``), as a batch that mixes adapters runs;
- ``grouped``: the chunk is split per adapter, one pass set per adapter, as
  batches formed per adapter run (each pass is smaller by the number of adapters).

A merged adapter costs exactly the base (its weights are the base's shape) but
serves one adapter only; it is not a row. Every repetition runs every chunk
through every row, rotating the order, so a busy spell hits all rows alike.
Reported: real tokens/s (padding excluded) and the ratio to ``base``.

    python -m bench.adapters [--n-texts 400] [--reps 3] [--adapters 4] [--rank 16]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import report, texts
from embedder.tasks.fleet import load_fleet
from embedder.tasks.embed.runtimes import Runtime, load_runtime

Row = Callable[[Sequence[str]], None]


def make_adapters(
    model_path: str, folder: Path, count: int, rank: int, targets: list[str]
) -> list[Path]:
    """``count`` LoRA adapters with random weights (speed does not depend on the values)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer

    out = []
    for i in range(count):
        inner = SentenceTransformer(model_path, device="cpu")[0].auto_model
        assert isinstance(inner, torch.nn.Module)
        torch.manual_seed(i)
        config = LoraConfig(
            r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False
        )
        path = folder / f"adapter-{i}"
        get_peft_model(inner, config).save_pretrained(str(path))
        out.append(path)
    return out


def rows(base: Runtime, lora: Runtime, names: list[str]) -> dict[str, Row]:
    def run(runtime: Runtime, adapters: Callable[[int], list[str | None] | None]) -> Row:
        def encode(chunk: Sequence[str]) -> None:
            runtime.forward(runtime.tokenize(chunk, "right"), adapters(len(chunk)))

        return encode

    def grouped(chunk: Sequence[str]) -> None:
        for k, name in enumerate(names):
            part = chunk[k :: len(names)]
            if part:
                lora.forward(lora.tokenize(part, "right"), [name] * len(part))

    return {
        "base": run(base, lambda n: None),
        "base, adapters resident": run(lora, lambda n: [None] * n),
        "one adapter": run(lora, lambda n: [names[0]] * n),
        f"mixed ({len(names)} adapters)": run(
            lora, lambda n: [names[i % len(names)] for i in range(n)]
        ),
        f"grouped ({len(names)} adapters)": grouped,
    }


def measure(
    methods: dict[str, Row], chunks: Sequence[Sequence[str]], reps: int
) -> dict[str, list[float]]:
    """Seconds per repetition and row; rows rotate their order per chunk."""
    seconds = {key: [0.0] * reps for key in methods}
    keys = list(methods)
    step = 0
    for rep in range(reps):
        for chunk in chunks:
            shift = step % len(keys)
            step += 1
            for key in [*keys[shift:], *keys[:shift]]:
                start = time.perf_counter()
                methods[key](chunk)
                seconds[key][rep] += time.perf_counter() - start
        print(
            f"  rep {rep + 1}/{reps}: "
            + ", ".join(f"{k} {s[rep]:.1f}s" for k, s in seconds.items())
        )
    return seconds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n-texts", type=int, default=400)
    parser.add_argument("--chunk", type=int, default=64, help="texts per call (a batch)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default="query,key,value", help="LoRA target modules")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=texts.SEED)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    fleet = load_fleet()
    spec = fleet.get(fleet.default_model)
    path = str(spec.source.resolve())
    corpus = texts.build(args.n_texts, args.seed)
    chunks = [corpus.texts[i : i + args.chunk] for i in range(0, len(corpus.texts), args.chunk)]
    print(f"loading {spec.name} twice ({args.threads} threads); {args.adapters} adapters, "
          f"rank {args.rank} on {args.targets}")  # fmt: skip
    base = load_runtime(spec, "cpu", args.threads)
    lora = load_runtime(spec, "cpu", args.threads)
    # Both rows run the same precision: the first runtime's load-time choice.
    lora.autocast = base.autocast  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory() as tmp:
        folders = make_adapters(path, Path(tmp), args.adapters, args.rank, args.targets.split(","))
        names = [f"adapter-{i}" for i in range(args.adapters)]
        for name, folder in zip(names, folders, strict=True):
            lora.load_adapter(name, folder)
    methods = rows(base, lora, names)
    measure(methods, chunks[:2], 1)  # warm-up: kernels for these shapes
    seconds = measure(methods, chunks, args.reps)
    tokens = sum(corpus.lengths)
    per_s = {key: tokens / report.median(s) for key, s in seconds.items()}
    result_rows = [
        {"method": key, "tokens_per_s": round(v, 1), "vs_base": round(v / per_s["base"], 3)}
        for key, v in per_s.items()
    ]
    print()
    lines = [[r["method"], r["tokens_per_s"], r["vs_base"]] for r in result_rows]
    print(report.table(["method", "tokens/s", "× base"], lines))
    data = {
        "benchmark": "adapters",
        "model": spec.name,
        "dtype": base.info.dtype,
        "texts": len(corpus.texts),
        "tokens": tokens,
        "chunk": args.chunk,
        "reps": args.reps,
        "adapters": args.adapters,
        "rank": args.rank,
        "targets": args.targets,
        "rows": result_rows,
        "machine": report.machine(args.threads),
    }
    print(f"\nwrote {report.write_json('adapters.json', data)}")
    return data


if __name__ == "__main__":
    main()
