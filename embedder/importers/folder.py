"""Writing a standard model folder: transformers weights and config, a tokenizer, and the
sentence-transformers files (modules, mean pooling, Normalize, prompts), so that
``AutoModel``, ``AutoTokenizer`` and ``SentenceTransformer`` all load it from a path.

Weights go to ``model.safetensors`` through safetensors' numpy API: no torch needed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from safetensors.numpy import save_file

# The sentence-transformers module names every version since 2.x resolves.
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True, slots=True)
class EncoderFolder:
    """Everything a mean-pooled, normalized sentence encoder folder holds."""

    config: Mapping[str, object]  # transformers' config.json
    weights: Mapping[str, NDArray[np.float32]]  # state-dict names, as the model class loads them
    tokenizer_json: Path  # copied byte for byte
    tokenizer_config: Mapping[str, object]
    special_tokens: Mapping[str, str]
    max_seq_length: int
    dimension: int
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    readme: str = ""


def _dump(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_encoder_folder(folder: EncoderFolder, out: Path) -> None:
    """Write ``folder`` into ``out`` (created; files already there are overwritten)."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: np.ascontiguousarray(value) for name, value in folder.weights.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    _dump(out / "config.json", dict(folder.config))
    shutil.copyfile(folder.tokenizer_json, out / "tokenizer.json")
    _dump(out / "tokenizer_config.json", dict(folder.tokenizer_config))
    _dump(out / "special_tokens_map.json", dict(folder.special_tokens))

    _dump(
        out / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": _POOLING},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": _NORMALIZE},
        ],
    )
    _dump(
        out / "sentence_bert_config.json",
        {"max_seq_length": folder.max_seq_length, "do_lower_case": False},
    )
    (out / "1_Pooling").mkdir(exist_ok=True)
    _dump(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": folder.dimension,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False,
            "include_prompt": True,  # the prompt's tokens are averaged in, as in training
        },
    )
    (out / "2_Normalize").mkdir(exist_ok=True)
    _dump(
        out / "config_sentence_transformers.json",
        {
            "prompts": dict(folder.prompts),
            "default_prompt_name": folder.default_prompt_name,
            "similarity_fn_name": "cosine",
        },
    )
    if folder.readme:
        (out / "README.md").write_text(folder.readme, encoding="utf-8")
