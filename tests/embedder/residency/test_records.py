"""The choice of what to evict: least recently used first, never a pinned or busy model
nor the one loading, nothing at all when evicting every candidate would not be enough."""

from __future__ import annotations

from embedder.residency.records import Residency, held_bytes, victims

MB = 1 << 20


def resident(name: str, mb: int, used: float, *, pinned: bool = False) -> Residency:
    return Residency(
        name, pinned=pinned, on_demand=True, state="ready", memory_bytes=mb * MB, last_used=used
    )


def loading(name: str, mb: int) -> Residency:
    return Residency(name, pinned=False, on_demand=True, state="loading", estimate_bytes=mb * MB)


def idle(name: str) -> bool:
    return False


def test_nothing_is_evicted_while_everything_fits() -> None:
    records = [resident("a", 100, 1.0), loading("b", 100)]
    assert victims(records, 0, 300 * MB, idle, loading="b") == []


def test_the_least_recently_used_goes_first_and_only_as_many_as_needed() -> None:
    records = [resident("a", 100, 3.0), resident("b", 100, 1.0), resident("c", 100, 2.0)]
    records.append(loading("d", 150))
    assert held_bytes(records) == 450 * MB
    assert victims(records, 0, 300 * MB, idle, loading="d") == ["b", "c"]
    assert victims(records, 0, 350 * MB, idle, loading="d") == ["b"]


def test_pinned_busy_and_loading_models_are_never_chosen() -> None:
    records = [
        resident("pinned", 100, 0.0, pinned=True),
        resident("busy", 100, 0.5),
        resident("old", 100, 1.0),
        loading("new", 100),
    ]
    chosen = victims(records, 0, 300 * MB, lambda name: name == "busy", loading="new")
    assert chosen == ["old"]


def test_none_when_even_every_candidate_would_not_make_room() -> None:
    records = [resident("pinned", 200, 0.0, pinned=True), resident("a", 50, 1.0)]
    records.append(loading("big", 200))
    assert victims(records, 0, 300 * MB, idle, loading="big") is None


def test_a_model_never_loaded_counts_by_its_weights_until_measured() -> None:
    guess = loading("new", 120)
    assert guess.expected_bytes == 120 * MB
    guess.memory_bytes = 80 * MB
    assert guess.expected_bytes == 80 * MB
    evicted = Residency("gone", pinned=False, on_demand=True, state="evicted", memory_bytes=MB)
    assert held_bytes([guess, evicted]) == 80 * MB
