"""The load-time tune (``--untuned quick``): runtime x precision at the fleet's shape, then
two pass shapes and two batch budgets (``QUICK``) on a few English calibration texts, for a
device with no tuned profile.
No retrieval check runs at load, so int8 candidates are refused here; `flotilla tune`
can admit them."""

from __future__ import annotations

from embedder.core.device import usable_cores
from embedder.core.fleet import DeviceKind
from embedder.tasks.embed.spec import EncoderSpec
from embedder.tuned import ProfileChoice
from embedder.tuning.candidates import plan_for
from embedder.tuning.corpus import english_sections, mixed_lengths, paragraphs_of
from embedder.tuning.measure import Workload
from embedder.tuning.search import Loader, Search


def quick_choice(
    spec: EncoderSpec, device: DeviceKind, loader: Loader, threads: int, fingerprint: str
) -> ProfileChoice:
    plan = plan_for(device, quick=True)
    texts = mixed_lengths(paragraphs_of(english_sections()), plan.texts)
    workload = Workload(texts, spec.prompt_prefix(use="document"))
    cores = usable_cores()
    outcome = Search(
        spec, device, loader, workload, threads=threads or cores, cores=cores, plan=plan
    ).run()
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
