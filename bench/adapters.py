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

With ``--fleet-adapters`` the adapters are the model's own (its fleet entry's), and
``--tuned FINGERPRINT`` serves the model with its tuned profile for that device
(``here``: this machine), on whatever runtime that is, so ``base`` is the model's tuned
speed; ``--dtype`` then pins the precision. On an exported-graph runtime the adapters'
merged graphs are built (or found cached) before timing, and the worst cosine of the
adapter rows to the torch fp32 model with the adapter merged is reported.

    python -m bench.adapters [--n-texts 400] [--reps 3] [--adapters 4] [--rank 16]
    python -m bench.adapters --model multilingual-e5-small --fleet-adapters \
        --tuned cpu:amd-epyc:avx2+avx512_bf16+avx512_vnni+avx512f+avx_vnni:2c
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
from embedder.core.fleet import entry_as
from embedder.tasks.embed.runtimes import Runtime, load_runtime
from embedder.tasks.embed.spec import EncoderSpec
from embedder.tasks.fleet import load_fleet

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


def served_spec(args: argparse.Namespace) -> EncoderSpec:
    """The model as the bench serves it: the fleet's profile, or its tuned one for
    ``--tuned``, with ``--dtype`` pinned over either."""
    from embedder.core.device import fingerprint
    from embedder.tuned import load_tuned

    fleet = load_fleet()
    spec = entry_as(fleet.get(args.model or fleet.default_model), EncoderSpec)
    if args.tuned:
        fp = fingerprint("cpu") if args.tuned == "here" else args.tuned
        tuned = load_tuned().entry(spec.name, fp)
        if tuned is None:
            raise SystemExit(f"no tuned profile of {spec.name} for {fp}")
        profile = spec.profile("cpu").model_copy(update=tuned.profile)
        spec = spec.model_copy(update={"profiles": {**spec.profiles, "cpu": profile}})
    if args.dtype:
        profile = spec.profile("cpu").model_copy(update={"dtype": args.dtype})
        spec = spec.model_copy(update={"profiles": {**spec.profiles, "cpu": profile}})
    return spec


def load_adapter(runtime: Runtime, name: str, folder: Path) -> None:
    """Load as the worker does, waiting out a graph runtime's build of the merged graph."""
    from embedder.core.errors import AdapterBuilding

    try:
        runtime.load_adapter(name, folder)
    except AdapterBuilding as building:
        print(f"  building the merged graph of {name} (or reading it from the cache)")
        if building.ready is not None:
            building.ready.exception()  # waits; a failure is raised by the load below
        runtime.load_adapter(name, folder)


def cosine_to_merged(
    spec: EncoderSpec, runtime: Runtime, name: str, folder: Path, sample: Sequence[str]
) -> float:
    """Worst cosine of ``name``'s rows to the torch fp32 model with the adapter merged."""
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    from embedder.tasks.embed.runtimes import worst_cosine

    reference = SentenceTransformer(str(spec.source.resolve()), device="cpu")
    transformer: Any = reference[0]
    merged = PeftModel.from_pretrained(transformer.auto_model, str(folder)).merge_and_unload()
    transformer.model = merged
    reference.max_seq_length = runtime.info.max_tokens
    want = reference.encode(list(sample), convert_to_numpy=True)
    got = runtime.forward(runtime.tokenize(sample, "right"), [name] * len(sample))
    return worst_cosine(want, got)


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
    parser.add_argument("--model", default=None, help="a fleet model; default the fleet's")
    parser.add_argument(
        "--fleet-adapters", action="store_true", help="the model's own adapters, not random"
    )
    parser.add_argument("--tuned", default=None, help="serve the tuned profile of FINGERPRINT")
    parser.add_argument("--dtype", default=None, help="pin this precision over the profile")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = served_spec(args)
    path = str(spec.source.resolve())
    corpus = texts.build(args.n_texts, args.seed)
    chunks = [corpus.texts[i : i + args.chunk] for i in range(0, len(corpus.texts), args.chunk)]
    profile = spec.profile("cpu")
    print(f"loading {spec.name} twice ({profile.runtime} {profile.dtype}, "
          f"{profile.threads or args.threads} threads)")  # fmt: skip
    base = load_runtime(spec, "cpu", args.threads)
    lora = load_runtime(spec, "cpu", args.threads)
    if hasattr(base, "autocast"):  # both rows run the first torch runtime's choice
        lora.autocast = base.autocast  # type: ignore[attr-defined]
    cosines: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.fleet_adapters:
            adapters = dict(spec.adapters)  # resolved beside the fleet file
        else:
            print(f"{args.adapters} random adapters, rank {args.rank} on {args.targets}")
            targets = args.targets.split(",")
            made = make_adapters(path, Path(tmp), args.adapters, args.rank, targets)
            adapters = {f"adapter-{i}": folder for i, folder in enumerate(made)}
        for name, folder in adapters.items():
            load_adapter(lora, name, folder)
            if profile.runtime != "torch":  # a merged graph: how close to the merged model
                cosines[name] = cosine_to_merged(spec, lora, name, folder, corpus.texts[:64])
        names = list(adapters)
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
    for name, cosine in cosines.items():
        print(f"{name}: worst cosine {cosine:.7f} to the torch fp32 model with it merged")
    data = {
        "benchmark": "adapters",
        "model": spec.name,
        "runtime": profile.runtime,
        "dtype": base.info.dtype,
        "adapter_worst_cosine_to_merged_fp32": cosines,
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
