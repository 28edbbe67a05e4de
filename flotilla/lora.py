"""Wiring for `flotilla lora`: data from laws, training an adapter, projecting its cost."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from embedder.core.fleet import DeviceKind
from flotilla import wiring
from flotilla.settings import LoraSettings
from lora.cost import project, unit_price
from lora.gesetze import read_laws
from lora.manifest import Manifest, read_manifest
from lora.pairs import write_sets
from lora.train import FORWARD_TOKENS, BaseModelRef


def data_gesetze(
    src: Path,
    out: Path,
    *,
    eval_fraction: float,
    seed: int,
    eval_laws: Sequence[str],
    eval_only: bool = False,
    pair_types: Sequence[str] = ("heading",),
) -> dict[str, object]:
    laws = read_laws(src)
    if not laws:
        raise SystemExit(f"no laws (*.md) in {src}")
    summary = write_sets(
        laws,
        out,
        eval_fraction=eval_fraction,
        seed=seed,
        eval_laws=eval_laws,
        eval_only=eval_only,
        pair_types=pair_types,
        source=str(src),
    )
    by_kind = ", ".join(f"{n} {kind}" for kind, n in summary["pairs_by_kind"].items())
    training = (
        "no training pairs (--eval-only)\n"
        if eval_only
        else f"{summary['train_pairs']} training pairs ({by_kind}) from "
        f"{len(summary['train_laws'])} laws -> {out / 'train.jsonl'}\n"
    )
    evaluation = (
        f"evaluation on {', '.join(summary['eval_laws'])}: {summary['corpus']} passages, "
        f"{summary['queries']} queries -> {out}/corpus.jsonl, queries.jsonl, qrels.tsv\n"
        if summary["eval_laws"]
        else "nothing held out for evaluation (--eval-fraction 0)\n"
    )
    print(
        training
        + evaluation
        + f"dropped {sum(summary['sections_dropped'].values())} sections (repealed, untitled "
        "or empty)"
    )
    return summary


def resolve_base(settings: LoraSettings, base: str, device: DeviceKind) -> BaseModelRef:
    """A folder path as it is, or a fleet model name (or alias) through the fleet file,
    with its prompts, its pooling and the pass size its profile for ``device`` sets."""
    path = Path(base).expanduser()
    if path.is_dir():
        return BaseModelRef(path.resolve(), forward_tokens=FORWARD_TOKENS[device])
    fleet = wiring.configured_fleet(settings)
    spec = fleet.get(base)  # ModelNotFound lists the fleet
    return BaseModelRef(
        spec.source.resolve(),  # an import source is imported here on first use
        spec.name,
        spec.pooling,
        spec.profile(device).forward_tokens,
        # the prompts serving puts before queries and documents
        prompts={
            "query": spec.prompt_prefix(use="query"),
            "passage": spec.prompt_prefix(use="document"),
        },
    )


def train(settings: LoraSettings, base: str, pairs: Path, out: Path, *, resume: bool) -> Manifest:
    from embedder.tasks.embed.runtimes import detect_device
    from lora.train import train as run

    device = detect_device() if settings.device == "auto" else settings.device
    ref = resolve_base(settings, base, device)
    manifest = run(
        ref,
        pairs,
        out,
        settings,
        settings,
        device=device,
        threads=settings.threads,
        resume=resume,
        progress_interval_s=settings.progress_interval_s,
    )
    print(summary(manifest, out))
    return manifest


def summary(m: Manifest, out: Path) -> str:
    measured, cost = m.measured, m.cost
    unit = "core" if cost.device == "cpu" else "GPU"
    price = (
        f"x ${cost.price_per_unit_hour_usd}/{unit}-hour = ${cost.usd:.4f}"
        if cost.usd is not None and cost.price_per_unit_hour_usd is not None
        else f"(no list price for {cost.device_name}; set one of the --price-* flags)"
    )
    return "\n".join(
        [
            f"adapter: {out} (rank {m.adapter.rank}, {m.training.steps} steps over "
            f"{m.training.pairs} pairs, {m.training.epochs} epoch(s))",
            f"loss {m.metrics.loss_first:.3f} -> {m.metrics.loss_last:.3f} "
            f"({m.training.loss}); peak memory {measured.peak_rss_bytes / 2**30:.2f} GiB resident",
            f"measured: {measured.wall_s:.1f} s wall ({measured.train_s:.1f} s training) on "
            f"{measured.device} ({measured.device_name}, {measured.threads} threads); "
            f"{measured.tokens:,} tokens at {measured.tokens_per_s:,.0f} tokens/s "
            f"({measured.tokens_per_core_s:,.0f} per CPU-second used)",
            f"cost: {cost.device_seconds:,.0f} {unit}-seconds {price}",
        ]
    )


GPUS = {"l4": "L4", "a10": "A10", "h100": "H100"}


def cost(settings: LoraSettings, adapter: Path, *, tokens_per_s: float, gpu: str) -> None:
    """The same run's work at another device's training throughput."""
    manifest = read_manifest(adapter)
    tokens = int(manifest["measured"]["tokens"])
    price, setting = unit_price("cuda", GPUS[gpu], settings)
    assert price is not None and setting is not None
    projected = project(tokens, tokens_per_s, price, GPUS[gpu])
    print(
        json.dumps(
            {
                "measured": {
                    k: manifest["measured"][k] for k in ("device_name", "tokens", "tokens_per_s")
                }
                | {"usd": manifest["cost"]["usd"]},
                "projected": {
                    "device": projected.device,
                    "tokens_per_s": projected.tokens_per_s,
                    "seconds": projected.seconds,
                    "price_per_hour_usd": price,
                    "price_setting": setting,
                    "usd": projected.usd,
                    "basis": "the run's measured tokens / the given throughput (assumed)",
                },
            },
            indent=2,
        )
    )
