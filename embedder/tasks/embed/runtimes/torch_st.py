"""The torch runtime: sentence-transformers' real loading code, our own batching.

Inputs arrive tokenized; ``forward`` sorts them by length and runs passes of
at most ``forward_tokens`` padded tokens, so mixed lengths waste little
compute on padding. On CUDA it runs the profile's dtype (bf16 by default) and,
when flash-attn is installed, unpadded (varlen) attention.

On CPU three precisions: ``float32``; ``bfloat16``, bf16 *weights* (every op in
bf16, the fastest where the CPU has AVX512-BF16 or AMX: 2.75x fp32 for MiniLM on
a Xeon with AMX); ``bfloat16-autocast``, fp32 weights under ``torch.autocast`` (matmuls
in bf16; layer norms, softmax, residuals and pooling in fp32: closer to fp32,
less faster). Which wins differs by CPU, so ``dtype: auto`` measures the three at
load on mixed-length texts and keeps the fastest whose vectors stay within
``MIN_COSINE`` of fp32 (and at least 10% faster than fp32); ``flotilla tune``
searches more widely, ahead of time, with its own guard. No int8 here: torch's
dynamic quantization measured a worst cosine of 0.85 (NOTES); ONNX Runtime and
OpenVINO offer int8 under the tuner's retrieval guard.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray

from embedder.core.device import cpu_flags
from embedder.core.errors import AdapterInvalid
from embedder.core.fleet import DeviceKind, FleetError
from embedder.core.jobs import Task
from embedder.tasks.embed.batching import micro_batches
from embedder.tasks.embed.runtimes import MIN_COSINE, PRECISIONS, Encoded, RuntimeInfo, worst_cosine
from embedder.tasks.embed.runtimes.lora import LoraSlots
from embedder.tasks.embed.runtimes.tokenizing import Tokenizing
from embedder.tasks.embed.spec import EncoderSpec

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
POOLING_MODES = {"mean": "mean", "cls": "cls", "last": "lasttoken"}
CPU_PRECISIONS = PRECISIONS["torch"]["cpu"]  # what `dtype: auto` chooses among
CALIBRATION_TEXT = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the annual "
    "budget. Researchers measured how quickly small language models answer questions about "
    "tax law, shipping schedules and the weather in coastal towns. Wer vorsätzlich oder "
    "fahrlässig das Leben, den Körper, die Gesundheit, die Freiheit, das Eigentum oder ein "
    "sonstiges Recht eines anderen widerrechtlich verletzt, ist dem anderen zum Ersatz des "
    "daraus entstehenden Schadens verpflichtet. "
)


def cpu_has_bf16() -> bool:
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


class TorchRuntime(Tokenizing):
    def __init__(
        self,
        spec: EncoderSpec,
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

    def prepare_adapter(self, name: str, folder: Path) -> None:
        pass  # peft loads an adapter in milliseconds, at its first request

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
    spec: EncoderSpec, device: torch.device, model_kwargs: dict[str, object]
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
    spec: EncoderSpec, device: torch.device, model_kwargs: dict[str, object]
) -> tuple[torch.nn.Module, object, int]:
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(spec.source.resolve()), device=str(device), model_kwargs=model_kwargs)
    model = ce.model.to(device).eval()
    max_tokens = min(spec.max_tokens, int(ce.max_seq_length or spec.max_tokens))
    return model, ce.tokenizer, max_tokens


def _calibration_texts() -> list[str]:
    words = CALIBRATION_TEXT.split()
    return [" ".join(words[(i * 5) % 40 : (i * 5) % 40 + 4 + (i * 7) % 60]) for i in range(32)]


def _worst_agreement(
    runtime: TorchRuntime, got: NDArray[np.float32], want: NDArray[np.float32]
) -> float:
    """Worst cosine to the fp32 vectors; for cross-encoders 1 - the worst score error
    relative to the largest score."""
    if runtime.cross:
        scale = float(np.abs(want).max()) + 1e-6
        return 1.0 - float(np.abs(got - want).max()) / scale
    return worst_cosine(want, got)


def _choose_cpu_precision(fp32: TorchRuntime, bf16: TorchRuntime | None) -> TorchRuntime:
    """Time fp32, bf16 autocast and bf16 weights (``bf16``: the same model, cast) on the
    same mixed-length texts; keep the fastest that is at least 10% faster than fp32 and
    stays within MIN_COSINE of it, else fp32."""
    texts = _calibration_texts()

    def encoded(runtime: TorchRuntime) -> Encoded:
        if runtime.cross:
            return runtime.tokenize_pairs(texts[0], texts, "right")
        return runtime.tokenize(texts, "right")

    inputs = encoded(fp32)
    autocast = copy.copy(fp32)  # the same weights, bf16 matmuls
    autocast.autocast = torch.bfloat16
    candidates = {"float32": fp32, "bfloat16-autocast": autocast}
    if bf16 is not None:
        candidates["bfloat16"] = bf16

    def timed(runtime: TorchRuntime) -> tuple[float, NDArray[np.float32]]:
        start = time.perf_counter()
        out = runtime.forward(inputs)
        return time.perf_counter() - start, out

    for runtime in candidates.values():  # warm up kernels for these shapes
        timed(runtime)
    # Interleaved, best of five: a busy machine slows every candidate, but in bursts. On a
    # shared 2-core CPU, best of three still chose wrongly in 2 of 12 busy calibrations.
    best: dict[str, float] = dict.fromkeys(candidates, float("inf"))
    outputs: dict[str, NDArray[np.float32]] = {}
    for _ in range(5):
        for name, runtime in candidates.items():
            seconds, out = timed(runtime)
            best[name] = min(best[name], seconds)
            outputs.setdefault(name, out)
    agreement = {name: _worst_agreement(fp32, outputs[name], outputs["float32"]) for name in best}
    eligible = [
        name
        for name in candidates
        if name == "float32"
        or (agreement[name] >= MIN_COSINE and best[name] < 0.9 * best["float32"])
    ]
    choice = min(eligible, key=lambda name: best[name])
    log.info(
        "%s: %s -> %s",
        fp32.spec.name,
        ", ".join(
            f"{name} {best[name] * 1e3:.1f} ms (worst cosine {agreement[name]:.6f})"
            for name in candidates
        ),
        choice,
    )
    return candidates[choice]


def _check_precision(spec: EncoderSpec, device: torch.device, wanted: str) -> None:
    if wanted == "int8":
        raise FleetError(
            f"model {spec.name!r}: the torch runtime has no int8 (torch's dynamic quantization "
            "moved vectors to a cosine of 0.85): use runtime onnx or openvino for int8, or a "
            "float dtype"
        )
    if wanted == "float16" and device.type != "cuda":
        raise FleetError(
            f"model {spec.name!r}: float16 runs on CUDA; on a CPU use bfloat16, "
            "bfloat16-autocast or float32"
        )


def load(spec: EncoderSpec, device_kind: DeviceKind, threads: int) -> TorchRuntime:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights are local; never reach for a hub
    profile = spec.profile(device_kind)
    threads = profile.threads or threads
    if device_kind == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    wanted = profile.dtype
    _check_precision(spec, device, wanted)
    autocast = torch.bfloat16 if wanted == "bfloat16-autocast" else None
    model_kwargs: dict[str, object] = {}
    if device.type == "cuda":
        weights = "bfloat16" if wanted == "auto" else wanted
        model_kwargs["dtype"] = DTYPES["float32" if autocast else weights]
        if importlib.util.find_spec("flash_attn") is not None:
            model_kwargs["attn_implementation"] = "flash_attention_2"
        else:
            model_kwargs["attn_implementation"] = "sdpa"
    elif wanted == "bfloat16":
        # Cast as each tensor loads, not after: a whole fp32 copy beside the bf16 one
        # would set the load's peak (multilingual-e5-small: 681 MB, not 1,009; the same
        # weights and vectors either way).
        model_kwargs["dtype"] = torch.bfloat16
    cross = spec.task == Task.RERANK
    if cross:
        module, tokenizer, max_tokens = _cross_encoder(spec, device, model_kwargs)
        dimension = None
    else:
        module, tokenizer, dimension, max_tokens = _bi_encoder(spec, device, model_kwargs)

    def runtime(module: torch.nn.Module, autocast: torch.dtype | None = None) -> TorchRuntime:
        made = TorchRuntime(
            spec,
            module,
            tokenizer,
            device=device,
            cross=cross,
            dimension=dimension,
            max_tokens=max_tokens,
        )
        made.autocast = autocast
        return made

    if device.type == "cuda":
        return runtime(module, autocast)
    if wanted == "bfloat16":
        return runtime(module.to(torch.bfloat16))  # loaded so: a no-op but for odd layers
    module = module.float()  # the folder may hold another dtype; the reference is fp32
    if wanted != "auto":
        return runtime(module, autocast)
    if not cpu_has_bf16():
        return runtime(module)
    # A cast copy: casting back would not restore the fp32 weights the others need.
    return _choose_cpu_precision(runtime(module), runtime(copy.deepcopy(module).to(torch.bfloat16)))
