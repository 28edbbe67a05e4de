"""Tiny deterministic fakes for plumbing tests (never for quality or speed claims)."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from embedder.core.errors import AdapterBuilding, AdapterInvalid
from embedder.core.fleet import DeviceKind, Fleet, ModelSpec
from embedder.core.jobs import TruncationSide
from embedder.tasks.embed.runtimes import Encoded, RuntimeInfo
from embedder.tasks.fleet import parse_fleet

FAIL_MARKER = "FAIL-THIS-BATCH"


class FakeRuntime:
    """Words become token ids; a vector is a pure function of a text's ids, so a test can
    compute the expected answer with ``expected_vector``. A text containing FAIL_MARKER
    makes the whole forward pass raise, as a broken model would."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        dimension: int = 8,
        seconds_per_token: float = 0.0,
        cross: bool = False,
    ) -> None:
        self.spec = spec
        self.dimension = dimension
        self.seconds_per_token = seconds_per_token
        self.info = RuntimeInfo(
            kind="cross-encoder" if cross else "bi-encoder",
            device="cpu",
            dtype="float32",
            dimension=None if cross else dimension,
            max_tokens=spec.max_tokens,
        )
        self.forward_calls: list[int] = []  # inputs per forward, for assertions
        self.adapter_calls: list[list[str | None]] = []  # row adapters per forward
        self.resident: set[str] = set()
        self.adapter_loads: list[str] = []
        self.adapter_prepares: list[str] = []
        # adapter -> its build: load_adapter says AdapterBuilding until the future is done
        self.building: dict[str, Future[None]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def word_ids(text: str) -> list[int]:
        return [101, *(zlib.crc32(w.encode()) % 30000 + 1000 for w in text.split()), 102]

    def _cut(self, ids: list[int], side: TruncationSide, head: int = 0) -> list[int]:
        """Cut to the limit; the first ``head`` words (a prompt) survive a left cut."""
        limit = self.info.max_tokens
        if len(ids) <= limit:
            return ids
        body = ids[1:-1]
        keep = limit - 2
        if side == "right":
            body = body[:keep]
        else:
            rest = body[head:]
            body = body[:head] + rest[len(rest) - (keep - head) :]
        return [ids[0], *body, ids[-1]]

    def tokenize(self, texts: Sequence[str], side: TruncationSide, prefix: str = "") -> Encoded:
        full = [self.word_ids(prefix + t) for t in texts]
        if any(FAIL_MARKER in t for t in texts):
            full = [[-1, *ids] for ids in full]  # poison: forward will raise
        head = len(prefix.split())
        return Encoded(
            ids=[self._cut(ids, side, head) for ids in full],
            type_ids=None,
            full_lengths=[len(ids) for ids in full],
        )

    def tokenize_pairs(self, query: str, docs: Sequence[str], side: TruncationSide) -> Encoded:
        return self.tokenize([f"{query} {doc}" for doc in docs], side)

    def prepare_adapter(self, name: str, folder: Path) -> None:
        self.adapter_prepares.append(name)

    def load_adapter(self, name: str, folder: Path) -> None:
        """A folder holding a file named ``broken`` fails to load, as a bad adapter would."""
        if (folder / "broken").exists():
            raise AdapterInvalid(f"adapter {name!r} does not fit model {self.spec.name!r}")
        if (build := self.building.get(name)) is not None:
            if not build.done():
                raise AdapterBuilding(f"adapter {name!r} is being built", ready=build)
            build.result()  # a failed build's error
        self.resident.add(name)
        self.adapter_loads.append(name)

    def unload_adapter(self, name: str) -> None:
        self.resident.discard(name)

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        with self._lock:
            self.forward_calls.append(len(encoded))
            self.adapter_calls.append(list(adapters or [None] * len(encoded)))
        if any(ids and ids[0] == -1 for ids in encoded.ids):
            raise RuntimeError("fake model failure")
        if missing := {a for a in adapters or () if a is not None} - self.resident:
            raise RuntimeError(f"adapters {missing} were not loaded before the forward pass")
        if self.seconds_per_token:
            time.sleep(self.seconds_per_token * encoded.tokens)
        vectors = np.stack(
            [
                self.vector_of_ids(ids) + self.adapter_shift(name)
                for ids, name in zip(encoded.ids, adapters or [None] * len(encoded), strict=True)
            ]
        )
        if self.info.kind == "cross-encoder":
            return vectors[:, 0].copy()
        return vectors

    def vector_of_ids(self, ids: Sequence[int]) -> NDArray[np.float32]:
        rng = np.random.default_rng(zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes()))
        return rng.standard_normal(self.dimension).astype(np.float32)

    def adapter_shift(self, adapter: str | None) -> NDArray[np.float32]:
        """What an adapter adds to every vector: a fixed offset per adapter name."""
        if adapter is None:
            return np.zeros(self.dimension, dtype=np.float32)
        rng = np.random.default_rng(zlib.crc32(adapter.encode()))
        return rng.standard_normal(self.dimension).astype(np.float32)

    def expected_vector(
        self, text: str, normalize: bool = True, prefix: str = "", adapter: str | None = None
    ) -> NDArray[np.float32]:
        ids = self._cut(self.word_ids(prefix + text), "right")
        v = self.vector_of_ids(ids) + self.adapter_shift(adapter)
        return v / np.linalg.norm(v) if normalize else v


E5_PROMPTS: dict[str, object] = {
    "prompts": {"query": "query: ", "passage": "passage: "},
    "default_prompt": "query",
    "query_prompt": "query",
    "document_prompt": "passage",
}


def fake_fleet(
    *names: str, max_tokens: int = 64, tmp: Path | None = None, **fields: object
) -> Fleet:
    """A fleet of embed models whose source folder exists but holds nothing; ``fields``
    go into every spec (``**E5_PROMPTS`` gives each e5's prompts)."""
    folder = str(tmp or Path(__file__).parent)
    return parse_fleet(
        {
            "models": {
                name: {
                    "source": {"path": folder},
                    "max_tokens": max_tokens,
                    "profiles": {
                        "cpu": {"max_batch_tokens": 512, "max_batch_requests": 16, "max_wait_ms": 1}
                    },
                    **fields,
                }
                for name in names
            }
        }
    )


class FakeLoader:
    """A ModelHost loader that builds FakeRuntimes and remembers them by model name."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs
        self.runtimes: dict[str, FakeRuntime] = {}

    def __call__(self, spec: ModelSpec, device: DeviceKind, threads: int) -> FakeRuntime:
        runtime = FakeRuntime(spec, **self.kwargs)  # type: ignore[arg-type]
        self.runtimes[spec.name] = runtime
        return runtime
