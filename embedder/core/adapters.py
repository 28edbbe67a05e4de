"""LoRA adapters served per request: which exist, and which are resident.

An adapter is a PEFT LoRA folder (``adapter_config.json`` plus weights). A model
serves the adapters its fleet entry names and those registered under
``<adapters_dir>/<model>/<adapter>/`` (``flotilla lora add``); registered ones are
found on first use, without a restart. This module is torch-free, so the gateway
can tell an unknown adapter (404) before a request reaches the queue.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from embedder.core.errors import AdapterInvalid, AdapterNotFound, FlotillaError
from embedder.core.fleet import FleetView, ModelSpec

CONFIG = "adapter_config.json"
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
MANIFEST = "flotilla_adapter.json"  # written by `flotilla lora train`: base model, data, cost
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    name: str
    base: str
    folder: Path
    rank: int | None


def check_adapter(spec: ModelSpec, name: str, folder: Path) -> AdapterInfo:
    """Validate an adapter folder for ``spec`` from its files alone (no weights loaded);
    AdapterInvalid says what is wrong and what to do."""
    if not NAME.match(name):
        raise AdapterInvalid(
            f"adapter name {name!r} must be 1-64 letters, digits, '.', '_' or '-' "
            "(no ':', which separates it from the model)"
        )
    if not folder.is_dir():
        raise AdapterInvalid(f"adapter {name!r}: folder {folder} does not exist")
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterInvalid(
            f"adapter {name!r}: {folder} has no {CONFIG}; save it with peft's save_pretrained"
        ) from None
    except (OSError, ValueError) as exc:
        raise AdapterInvalid(f"adapter {name!r}: {folder / CONFIG} is unreadable: {exc}") from exc
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterInvalid(
            f"adapter {name!r} is a {config.get('peft_type')!r} adapter; only LoRA is served"
        )
    if not any((folder / weights).is_file() for weights in WEIGHTS):
        raise AdapterInvalid(f"adapter {name!r}: {folder} has no weights ({' or '.join(WEIGHTS)})")
    manifest_path = folder / MANIFEST
    if manifest_path.is_file():
        try:
            # `flotilla lora train` names the base by its fleet name (and weights hash).
            base = (json.loads(manifest_path.read_text(encoding="utf-8")).get("base") or {}).get(
                "name"
            )
        except (OSError, ValueError, AttributeError) as exc:
            raise AdapterInvalid(f"adapter {name!r}: {manifest_path} is unreadable: {exc}") from exc
        if base is not None and base not in (spec.name, *spec.aliases):
            raise AdapterInvalid(
                f"adapter {name!r} was trained on {base!r}, not on {spec.name!r}: "
                f"register it for {base!r}"
            )
    rank = config.get("r")
    return AdapterInfo(name, spec.name, folder, int(rank) if isinstance(rank, int) else None)


class AdapterCatalog:
    """The adapters each model serves: the fleet's, plus those registered on disk."""

    def __init__(self, fleet: FleetView, root: Path | None = None) -> None:
        self.fleet = fleet
        self.root = root
        self._registered: dict[str, dict[str, Path]] = {}

    def _scan(self, model: str) -> dict[str, Path]:
        folder = self.root / model if self.root is not None else None
        found = (
            {p.name: p for p in sorted(folder.iterdir()) if p.is_dir() and NAME.match(p.name)}
            if folder is not None and folder.is_dir()
            else {}
        )
        self._registered[model] = found
        return found

    def names(self, model: str) -> dict[str, Path]:
        """Every adapter ``model`` serves, name -> folder; the fleet's win a name clash."""
        spec = self.fleet.get(model)
        return {**self._scan(spec.name), **spec.adapters}

    def find(self, model: str, adapter: str) -> Path:
        spec = self.fleet.get(model)
        folder = spec.adapters.get(adapter) or self._registered.get(spec.name, {}).get(adapter)
        if folder is None:  # registered since the last look?
            folder = self._scan(spec.name).get(adapter)
        if folder is None:
            known = ", ".join(sorted(self.names(spec.name))) or "none"
            raise AdapterNotFound(
                f"adapter {adapter!r} is not registered for model {spec.name!r}; its adapters: "
                f"{known}. Add one with `flotilla lora add {adapter} DIR --base {spec.name}`"
            )
        return folder

    def register(self, model: str, name: str, source: Path) -> AdapterInfo:
        """Validate ``source`` and copy it to ``<root>/<model>/<name>``, atomically: a
        running worker never sees half a folder."""
        if self.root is None:
            raise AdapterInvalid("no adapters directory is configured (--adapters-dir)")
        spec = self.fleet.get(model)
        info = check_adapter(spec, name, source)
        target = self.root / spec.name / name
        if target.exists() or name in spec.adapters:
            raise AdapterInvalid(f"adapter {name!r} already exists for {spec.name!r} ({target})")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        shutil.copytree(source, staging, dirs_exist_ok=True)
        staging.rename(target)
        self._scan(spec.name)
        return dataclasses.replace(info, folder=target)


class ResidentAdapters:
    """The adapters loaded into one runtime, least recently used first out.

    Loading and unloading are the runtime's; this keeps the order and the cap. It is
    used from the worker's executor thread only, so it needs no lock.
    """

    def __init__(
        self,
        capacity: int,
        load: Callable[[str, Path], None],
        unload: Callable[[str], None],
    ) -> None:
        self.capacity = capacity
        self._load = load
        self._unload = unload
        self._resident: OrderedDict[str, Path] = OrderedDict()

    @property
    def names(self) -> list[str]:
        return list(self._resident)

    @property
    def folders(self) -> dict[str, Path]:
        """The resident adapters and their folders, least recently used first: what a
        runtime replacing this one loads before it serves."""
        return dict(self._resident)

    def ensure(self, wanted: Mapping[str, Path]) -> dict[str, FlotillaError]:
        """Make every wanted adapter resident; returns the ones that failed to load.
        A batch may need more adapters than the cap: they all stay until the next."""
        failed: dict[str, FlotillaError] = {}
        for name, folder in wanted.items():
            if self._resident.get(name) == folder:
                self._resident.move_to_end(name)
                continue
            if name in self._resident:  # re-registered elsewhere: reload
                self._drop(name)
            self._evict(keep=wanted, room_for=1)
            try:
                self._load(name, folder)
            except FlotillaError as exc:
                failed[name] = exc
            except Exception as exc:  # a broken file: that adapter's requests fail alone
                failed[name] = AdapterInvalid(f"adapter {name!r} failed to load: {exc}")
            else:
                self._resident[name] = folder
        return failed

    def _evict(self, keep: Iterable[str], room_for: int) -> None:
        keep = set(keep)
        for name in list(self._resident):
            if len(self._resident) + room_for <= self.capacity:
                return
            if name not in keep:
                self._drop(name)

    def _drop(self, name: str) -> None:
        del self._resident[name]
        self._unload(name)
