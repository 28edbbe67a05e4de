"""LoRA adapters on a loaded torch model, unmerged, many at once.

PEFT injects each adapter's low-rank matrices beside the base weights; a forward
pass is told per row which adapter to apply (``"__base__"`` for none), so one batch
can mix adapters. Merging would make one adapter free but every other one wrong; the
exported-graph runtimes merge anyway (``merged``), one graph per adapter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from embedder.core.errors import AdapterInvalid

BASE = "__base__"  # peft's row name for "no adapter"


@contextlib.contextmanager
def fitting(name: str, model_name: str) -> Iterator[None]:
    """peft's errors for weights that do not fit the model, as AdapterInvalid."""
    try:
        yield
    except (RuntimeError, ValueError, KeyError) as exc:  # shapes or target modules
        raise AdapterInvalid(f"adapter {name!r} does not fit model {model_name!r}: {exc}") from exc


def merged(model: torch.nn.Module, name: str, folder: Path, model_name: str) -> torch.nn.Module:
    """``model`` with the adapter's low-rank update added into its weights: one adapter
    for every row, at the base model's cost (what an exported graph of it runs)."""
    from peft import PeftModel

    with fitting(name, model_name):
        peft = PeftModel.from_pretrained(model, str(folder), adapter_name=name, is_trainable=False)
    plain: torch.nn.Module = peft.merge_and_unload()
    return plain.eval()


class LoraSlots:
    """The adapters injected into one Hugging Face model."""

    def __init__(self, model: torch.nn.Module, model_name: str) -> None:
        self.model = model
        self.model_name = model_name
        self._peft: torch.nn.Module | None = None  # a PeftModel once an adapter is loaded

    @property
    def active(self) -> bool:
        return self._peft is not None

    def load(self, name: str, folder: Path) -> None:
        from peft import PeftModel

        with fitting(name, self.model_name):
            if self._peft is None:
                self._peft = PeftModel.from_pretrained(
                    self.model, str(folder), adapter_name=name, is_trainable=False
                )
            else:
                self._peft.load_adapter(str(folder), adapter_name=name, is_trainable=False)  # type: ignore[operator]
        self._peft.eval()

    def unload(self, name: str) -> None:
        if self._peft is None:
            return
        if set(self._peft.peft_config) == {name}:  # type: ignore[arg-type]
            # The last one: take the LoRA layers out (peft keeps pointing at a deleted
            # active adapter otherwise), and base passes are plain again.
            self._peft.unload()  # type: ignore[operator]
            self._peft = None
        else:
            self._peft.delete_adapter(name)  # type: ignore[operator]

    @contextlib.contextmanager
    def rows(self, adapters: Sequence[str | None]) -> Iterator[None]:
        """Within this block, row i of the model's input runs ``adapters[i]``.

        This is the hook PeftModel.forward itself installs for ``adapter_names``; it is
        used directly because sentence-transformers calls the inner model, whose forward
        does not take that argument.
        """
        if self._peft is None:
            if any(adapters):
                raise AdapterInvalid("no adapter is loaded")  # the worker loads before it runs
            yield
            return
        names = [name or BASE for name in adapters]
        with self._peft._enable_peft_forward_hooks(adapter_names=names):  # type: ignore[operator]
            yield
