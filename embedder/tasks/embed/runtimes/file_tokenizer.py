"""A model folder's ``tokenizer.json`` through the ``tokenizers`` library alone, called the
way ``Tokenizing`` calls a ``transformers`` fast tokenizer.

Why: ``transformers`` imports torch when torch is installed, and torch alone makes a
process several hundred MB larger. The emulated device runs no model, so a worker on
it needs only the tokenizer; with this class a cluster of emulated worker processes
stays light enough to run dozens on one machine. The ids are those of the fast
tokenizer ``transformers`` builds from the same file (the same Rust library underneath;
``tests/embedder/tasks/embed/runtimes/test_emulated.py`` checks them against the torch runtime's).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# transformers' tokenizer classes whose outputs carry no token_type_ids (their
# ``model_input_names``); every other fast tokenizer returns them.
_NO_TYPE_IDS = frozenset(
    {"XLMRobertaTokenizer", "RobertaTokenizer", "CamembertTokenizer", "MPNetTokenizer",
     "GPT2Tokenizer", "LlamaTokenizer", "DistilBertTokenizer"}
)  # fmt: skip
_STRATEGIES = {True: "longest_first", "longest_first": "longest_first",
               "only_first": "only_first", "only_second": "only_second"}  # fmt: skip


def has_file_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file()


class FileTokenizer:
    """``tokenizer(first, second, add_special_tokens=..., truncation=..., max_length=...)``
    as ``transformers`` answers it: a dict of ``input_ids`` (and ``token_type_ids``,
    ``offset_mapping``, ``special_tokens_mask`` when asked), lists for lists."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tok.no_padding()
        config_path = folder / "tokenizer_config.json"
        config: dict[str, Any] = (
            json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        )
        self.model_max_length = int(min(float(config.get("model_max_length", 512)), 1e12))
        self.truncation_side: str = str(config.get("truncation_side", "right"))
        names = config.get("model_input_names")
        kind = str(config.get("tokenizer_class", "")).removesuffix("Fast")
        self._type_ids = (
            "token_type_ids" in names if isinstance(names, list) else kind not in _NO_TYPE_IDS
        )

    def __call__(
        self,
        first: str | Sequence[str],
        second: Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        truncation: bool | str = False,
        max_length: int | None = None,
        verbose: bool = False,
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
    ) -> dict[str, Any]:
        single = isinstance(first, str)
        firsts = [first] if isinstance(first, str) else list(first)
        if truncation:
            self._tok.enable_truncation(
                max_length or self.model_max_length,
                strategy=_STRATEGIES[truncation],
                direction=self.truncation_side,
            )
        else:
            self._tok.no_truncation()
        inputs: list[Any] = list(zip(firsts, second, strict=True)) if second else firsts
        try:
            encodings = self._tok.encode_batch(inputs, add_special_tokens=add_special_tokens)
        finally:
            self._tok.no_truncation()
        out: dict[str, Any] = {"input_ids": [e.ids for e in encodings]}
        if self._type_ids:
            out["token_type_ids"] = [e.type_ids for e in encodings]
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encodings]
        if return_special_tokens_mask:
            out["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
        return {k: v[0] for k, v in out.items()} if single else out
