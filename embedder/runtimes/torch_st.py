"""The torch runtime: sentence-transformers' real loading code, our own batching.

Inputs arrive tokenized; ``forward`` sorts them by length and runs passes of
at most ``forward_tokens`` padded tokens, so mixed lengths waste little
compute on padding. On CUDA it runs bf16 weights and, when flash-attn is
installed, unpadded (varlen) attention. On CPU, bf16 means mixed precision:
fp32 weights under ``torch.autocast``, so matmuls run in bf16 while layer
norms, softmax, residuals and pooling stay fp32. Pure bf16 weights measured
no faster here and lost accuracy (worst cosine 0.99985 against fp32 on German
law text, autocast 0.99995). ``dtype: auto`` times fp32 against bf16 at load
and keeps bf16 only when it is faster and accurate.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray

from embedder.batching import micro_batches
from embedder.errors import AdapterInvalid
from embedder.fleet import DeviceKind, ModelSpec
from embedder.jobs import Task
from embedder.runtimes import Encoded, RuntimeInfo
from embedder.runtimes.lora import LoraSlots
from embedder.runtimes.tokenizing import Tokenizing

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
POOLING_MODES = {"mean": "mean", "cls": "cls", "last": "lasttoken"}
MIN_COSINE = 0.9999  # a reduced-precision choice must keep vectors this close to fp32
CALIBRATION_TEXT = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the annual "
    "budget. Researchers measured how quickly small language models answer questions about "
    "tax law, shipping schedules and the weather in coastal towns. Wer vorsätzlich oder "
    "fahrlässig das Leben, den Körper, die Gesundheit, die Freiheit, das Eigentum oder ein "
    "sonstiges Recht eines anderen widerrechtlich verletzt, ist dem anderen zum Ersatz des "
    "daraus entstehenden Schadens verpflichtet. "
)


def cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class TorchRuntime(Tokenizing):
    def __init__(
        self,
        spec: ModelSpec,
        module: torch.nn.Module,
        tokenizer: object,
        *,
        device: torch.device,
        cross: bool,
        dimension: int | None,
        max_tokens: int,
    ) -> None:
        self.spec = spec
        self.module = module
        self.tokenizer = tokenizer
        self.device = device
        self.cross = cross
        self.dimension = dimension
        self.max_tokens = max_tokens
        self.autocast: torch.dtype | None = None  # mixed precision over fp32 weights
        self.pad_id = int(getattr(tokenizer, "pad_token_id", 0) or 0)
        profile = spec.profile("cuda" if device.type == "cuda" else "cpu")
        self.forward_tokens = profile.forward_tokens
        self.forward_max_sequences = profile.forward_max_sequences
        # Adapters go into the Hugging Face model inside the first (Transformer) module.
        inner = (
            getattr(module[0], "auto_model", None)
            if isinstance(module, torch.nn.Sequential)
            else None
        )
        self.lora = LoraSlots(inner, spec.name) if isinstance(inner, torch.nn.Module) else None

    @property
    def info(self) -> RuntimeInfo:
        weights = str(next(self.module.parameters()).dtype).removeprefix("torch.")
        if self.autocast is not None:
            dtype = f"{str(self.autocast).removeprefix('torch.')}-autocast ({weights} weights)"
        else:
            dtype = weights
        return RuntimeInfo(
            kind="cross-encoder" if self.cross else "bi-encoder",
            device=str(self.device),
            dtype=dtype,
            dimension=self.dimension,
            max_tokens=self.max_tokens,
        )

    # -- running ----------------------------------------------------------

    def _tensors(self, encoded: Encoded, rows: list[int]) -> dict[str, torch.Tensor]:
        width = max(len(encoded.ids[i]) for i in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        types = torch.zeros((len(rows), width), dtype=torch.long)
        for r, i in enumerate(rows):
            n = len(encoded.ids[i])
            ids[r, :n] = torch.tensor(encoded.ids[i])
            mask[r, :n] = 1
            if encoded.type_ids is not None:
                types[r, :n] = torch.tensor(encoded.type_ids[i])
        return {
            "input_ids": ids.to(self.device),
            "attention_mask": mask.to(self.device),
            "token_type_ids": types.to(self.device),
        }

    def _run(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.cross:
            logits: torch.Tensor = self.module(**features).logits
            return logits[:, 0] if logits.shape[-1] == 1 else logits.max(dim=-1).values
        out: torch.Tensor = self.module(features)["sentence_embedding"]
        return out

    # -- adapters ---------------------------------------------------------

    def load_adapter(self, name: str, folder: Path) -> None:
        if self.lora is None:
            raise AdapterInvalid(
                f"model {self.spec.name!r} takes no adapters: they are served for "
                "sentence-transformers embedding models"
            )
        self.lora.load(name, folder)

    def unload_adapter(self, name: str) -> None:
        if self.lora is not None:
            self.lora.unload(name)

    def _adapter_rows(
        self, adapters: Sequence[str | None] | None, rows: list[int]
    ) -> contextlib.AbstractContextManager[None]:
        if self.lora is None or not (self.lora.active or adapters):
            return contextlib.nullcontext()
        # Once any adapter is injected every pass names its rows, base rows included.
        return self.lora.rows([adapters[i] if adapters else None for i in rows])

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        lengths = [len(x) for x in encoded.ids]
        passes = micro_batches(lengths, self.forward_tokens, self.forward_max_sequences)
        result: NDArray[np.float32] | None = None
        with (
            torch.inference_mode(),
            torch.autocast(
                self.device.type,
                dtype=self.autocast or torch.bfloat16,
                enabled=self.autocast is not None,
            ),
        ):
            for rows in passes:
                with self._adapter_rows(adapters, rows):
                    out = self._run(self._tensors(encoded, rows)).float().cpu().numpy()
                if result is None:
                    result = np.empty((len(encoded), *out.shape[1:]), dtype=np.float32)
                result[rows] = out
        assert result is not None, "forward needs at least one input"
        return result


def _bi_encoder(
    spec: ModelSpec, device: torch.device, model_kwargs: dict[str, object]
) -> tuple[torch.nn.Module, object, int, int]:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    st = SentenceTransformer(
        str(spec.source.resolve()), device=str(device), model_kwargs=model_kwargs
    )
    modules = list(st)
    # Normalization is applied per request (TEI's `normalize`), so drop the model's own.
    while modules and isinstance(modules[-1], Normalize):
        modules.pop()
    dimension = int(st.get_embedding_dimension() or 0)
    if spec.pooling != "model":
        index = next(i for i, m in enumerate(modules) if isinstance(m, Pooling))
        modules[index] = Pooling(dimension, pooling_mode=POOLING_MODES[spec.pooling])
    module = torch.nn.Sequential(*modules).to(device).eval()
    max_tokens = min(spec.max_tokens, int(st.max_seq_length or spec.max_tokens))
    return module, st.tokenizer, dimension, max_tokens


def _cross_encoder(
    spec: ModelSpec, device: torch.device, model_kwargs: dict[str, object]
) -> tuple[torch.nn.Module, object, int]:
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(spec.source.resolve()), device=str(device), model_kwargs=model_kwargs)
    model = ce.model.to(device).eval()
    max_tokens = min(spec.max_tokens, int(ce.max_seq_length or spec.max_tokens))
    return model, ce.tokenizer, max_tokens


def _choose_cpu_autocast(runtime: TorchRuntime) -> torch.dtype | None:
    """Time fp32 and bf16 autocast on the same mixed-length texts; keep bf16 only when
    it is faster and its outputs stay within MIN_COSINE of fp32."""
    if not cpu_has_bf16():
        return None
    words = CALIBRATION_TEXT.split()
    texts = [" ".join(words[(i * 5) % 40 : (i * 5) % 40 + 4 + (i * 7) % 60]) for i in range(32)]
    if runtime.cross:
        encoded = runtime.tokenize_pairs(texts[0], texts, "right")
    else:
        encoded = runtime.tokenize(texts, "right")

    def timed(autocast: torch.dtype | None) -> tuple[float, NDArray[np.float32]]:
        runtime.autocast = autocast
        start = time.perf_counter()
        out = runtime.forward(encoded)
        return time.perf_counter() - start, out

    for autocast in (None, torch.bfloat16):  # warm up kernels for these shapes
        timed(autocast)
    # Interleaved, best of five: a busy machine slows both sides, but in bursts. On a
    # shared 2-core CPU, best of three still chose fp32 in 2 of 12 busy calibrations.
    runs = [(timed(None), timed(torch.bfloat16)) for _ in range(5)]
    fp32_s, fp32_out = min(run[0][0] for run in runs), runs[0][0][1]
    bf16_s, bf16_out = min(run[1][0] for run in runs), runs[0][1][1]
    if runtime.cross:
        scale = float(np.abs(fp32_out).max()) + 1e-6
        ok = bool(np.allclose(bf16_out, fp32_out, atol=0.01 * scale))
        cosine = float("nan")
    else:
        a = fp32_out / np.linalg.norm(fp32_out, axis=1, keepdims=True)
        b = bf16_out / np.linalg.norm(bf16_out, axis=1, keepdims=True)
        cosine = float((a * b).sum(axis=1).min())
        ok = cosine >= MIN_COSINE
    choice = torch.bfloat16 if ok and bf16_s < fp32_s * 0.9 else None
    log.info(
        "%s: fp32 %.1f ms, bf16 autocast %.1f ms (worst cosine %.6f) -> %s",
        runtime.spec.name,
        fp32_s * 1e3,
        bf16_s * 1e3,
        cosine,
        "bf16 autocast" if choice else "fp32",
    )
    runtime.autocast = choice
    return choice


def load(spec: ModelSpec, device_kind: DeviceKind, threads: int) -> TorchRuntime:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub
    if device_kind == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    wanted = spec.profile(device_kind).dtype
    model_kwargs: dict[str, object] = {}
    if device.type == "cuda":
        model_kwargs["dtype"] = DTYPES["bfloat16" if wanted == "auto" else wanted]
        if importlib.util.find_spec("flash_attn") is not None:
            model_kwargs["attn_implementation"] = "flash_attention_2"
        else:
            model_kwargs["attn_implementation"] = "sdpa"
    cross = spec.task is Task.RERANK
    if cross:
        module, tokenizer, max_tokens = _cross_encoder(spec, device, model_kwargs)
        dimension = None
    else:
        module, tokenizer, dimension, max_tokens = _bi_encoder(spec, device, model_kwargs)
    runtime = TorchRuntime(
        spec,
        module,
        tokenizer,
        device=device,
        cross=cross,
        dimension=dimension,
        max_tokens=max_tokens,
    )
    if device.type == "cpu":
        # Weights stay fp32 on CPU; reduced precision is autocast (see the module doc).
        runtime.module = runtime.module.float()
        if wanted == "auto":
            _choose_cpu_autocast(runtime)
        elif wanted != "float32":
            runtime.autocast = DTYPES[wanted]
    return runtime
