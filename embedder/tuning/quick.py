"""The quick search, which the load-time tune (``--untuned quick``) and the background tune
(``embedder.tuning.background``) both run: runtime x precision at the fleet's shape, then
two pass shapes and the batch budgets of ``QUICK`` (or the GPU's quick plan) on a few
English calibration texts, for a device with no tuned profile. No retrieval check runs
here, so int8 is not timed; `flotilla tune` can admit it."""

from __future__ import annotations

from embedder.core.device import usable_cores
from embedder.core.fleet import DeviceKind
from embedder.tasks.embed.spec import EncoderSpec
from embedder.tuned import ProfileChoice
from embedder.tuning.candidates import plan_for
from embedder.tuning.corpus import english_sections, mixed_lengths, paragraphs_of
from embedder.tuning.measure import Workload
from embedder.tuning.search import Loader, Progress, Search

# What the quick search calibrates on, as a tuned entry records it.
CALIBRATION = "English: Python's language reference topics (pydoc_data.topics)"


def quick_search(
    spec: EncoderSpec,
    device: DeviceKind,
    loader: Loader,
    threads: int,
    progress: Progress | None = None,
) -> Search:
    """The quick search of ``spec`` on this kind of device, with the threads serving
    uses (every usable core when 0)."""
    plan = plan_for(device, quick=True)
    texts = mixed_lengths(paragraphs_of(english_sections()), plan.texts)
    workload = Workload(texts, spec.prompt_prefix(use="document"))
    cores = usable_cores()
    return Search(
        spec, device, loader, workload, threads=threads or cores, cores=cores, plan=plan,
        progress=progress,
    )  # fmt: skip


def quick_choice(
    spec: EncoderSpec, device: DeviceKind, loader: Loader, threads: int, fingerprint: str
) -> ProfileChoice:
    outcome = quick_search(spec, device, loader, threads).run()
    chosen = outcome.chosen
    fleet = spec.profile(device)
    profile = fleet.model_copy(update=chosen.candidate.fields())
    why = (
        f"no tuned profile for {fingerprint}; quick tune at load: {chosen.candidate.label} "
        f"{chosen.tokens_per_s or 0:,.0f} tok/s "
        f"(fp32 {outcome.reference.tokens_per_s or 0:,.0f}), worst cosine "
        f"{chosen.verdict.worst_cosine if chosen.verdict else float('nan'):.5f}"
    )
    return ProfileChoice(profile, "quick", fingerprint, why)
