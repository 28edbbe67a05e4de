"""What the host and the gateway know of a task kind: one small descriptor per kind.

A kind names its fleet entry (``spec``), the HTTP routes whose bodies it decodes and the
API shape of each, which kinds' models may answer its requests, how a model of it loads
(``load``, blocking: the host runs it in a thread) and the engine that serves its loaded
models. Kinds whose models run in the same loop name the same engine (embedding and
rerank models share the pipelined encoder worker); the host makes one engine per name.
Everything here is torch-free: a kind imports its runtimes and engine only when called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from embedder.core.adapters import AdapterCatalog
from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.core.jobs import ApiShape
from embedder.queue import JobPuller
from embedder.serving.turns import DeviceTurns

if TYPE_CHECKING:  # tuned reads the encoders' profile, whose kind imports this module
    from embedder.tuned import ProfileChoice

_C = TypeVar("_C")

# Loads one model's runtime on a device with some threads; blocking.
Loader = Callable[[ModelSpec, DeviceKind, int], Any]
# (spec, device, loader, threads, device fingerprint) -> the profile to serve with; blocking.
QuickTune = Callable[[ModelSpec, DeviceKind, Loader, int, str], "ProfileChoice"]


class Engine(Protocol):
    """The loop that serves a kind's loaded models on this device."""

    async def serve(self, spec: ModelSpec, runtime: Any) -> None:
        """Start serving one more loaded model (the first starts the loop)."""

    def describe(self, model: str) -> dict[str, object] | None:
        """What ``/v1/models`` shows of a model this engine serves; None if not one."""

    def healthy(self, model: str) -> bool:
        """Whether the loop serving ``model`` runs: False once it has died (of a bug, its
        traceback logged), so the model reads as failed instead of hanging its requests."""

    async def stop(self) -> None:
        """Stop; every job taken and not answered is failed, so no request hangs."""


@runtime_checkable
class Switching(Protocol):
    """An engine that can move a model it serves to another runtime between batches."""

    async def switch(self, spec: ModelSpec, runtime: Any) -> None:
        """Serve ``spec`` with ``runtime`` from the next batch on; no request fails or
        waits for it."""


@runtime_checkable
class Unloading(Protocol):
    """An engine that can stop serving one model and let its runtime go (an eviction, a
    model removed while serving). A model on an engine without it is never evicted."""

    def in_hand(self, model: str) -> int:
        """Jobs of ``model`` taken and not yet answered."""

    async def unserve(self, model: str) -> None:
        """Stop pulling for ``model``; return once its batches in flight are delivered and
        the engine holds no reference to its runtime."""


@dataclass(frozen=True)
class EngineContext:
    """What an engine is made with: the queue it pulls from, the device's turns it shares
    with the other engines, and the options of the kinds that take some (keyed by the
    option's type: a kind asks for its own)."""

    queue: JobPuller
    turns: DeviceTurns
    device: DeviceKind
    adapters: AdapterCatalog
    options: Mapping[type, object] = field(default_factory=dict)

    def option(self, kind: type[_C]) -> _C:
        """The option of this type the host was given, else its defaults."""
        value = self.options.get(kind)
        return value if isinstance(value, kind) else kind()


@dataclass(frozen=True)
class TaskKind:
    name: str  # the fleet entry's `task:`
    spec: type[ModelSpec]
    routes: Mapping[str, str]  # HTTP path -> the API shape of its bodies
    bodies: Mapping[ApiShape, type] | Mapping[str, type]  # API shape -> its body struct
    load: Loader
    engine: str  # the engine its models run in (one per name on a device)
    make_engine: Callable[[EngineContext], Engine]
    # Kinds whose models may answer this kind's requests (a rerank may score with an
    # embedding model's vectors); the kind's own first, the default when a request names
    # no model.
    answered_by: tuple[str, ...] = ()
    # `--untuned quick`: a brief tune at load for a model with no tuned profile; a kind
    # that has one is also tuned in the background (`--untuned background`)
    quick_tune: QuickTune | None = None
    # One small pass on a loaded runtime (blocking), run before an on-demand model serves:
    # its first request does not pay for kernel selection, and its memory is measured with
    # its weights touched (mapped weight files count only once read).
    warm_up: Callable[[Any], None] | None = None
    # Imports the libraries its loads need (blocking), run once before any on-demand
    # model loads: else the first model's measured memory holds the libraries too
    # (hundreds of MB against a model of tens), and a budget meant for two holds one.
    prepare: Callable[[], None] | None = None

    @property
    def answering(self) -> tuple[str, ...]:
        return self.answered_by or (self.name,)

    @property
    def tunable(self) -> bool:
        """`flotilla tune` times its models: the tuner (embedder.tuning) serves the kinds
        it has a quick, load-time form for."""
        return self.quick_tune is not None
