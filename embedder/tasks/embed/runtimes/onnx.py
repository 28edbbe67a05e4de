"""The ONNX Runtime runtime: the model's exported graph, with fused attention, in fp32
or with int8 matmuls.

float32 runs the export after ONNX Runtime's transformer optimizer has fused each
layer's attention, GELU and layer norms (BERT-family models; others run the plain
export). int8 is dynamic quantization of that graph: weights int8 per output channel,
activations quantized per pass. With VNNI (vpdpbusd multiplies unsigned by signed
bytes) the weights are signed int8; without it, unsigned, since signed weights then
saturate in the u8×s8 kernels. int8 moves vectors (worst cosine 0.98 on all-MiniLM-L6-v2
in an earlier probe), so 'auto' never picks it: the tuner does, behind its retrieval guard.
ONNX Runtime's CPU provider has no bf16 arithmetic; bf16 profiles are refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from embedder.core.device import cpu_flags
from embedder.core.fleet import DeviceKind, FleetError
from embedder.tasks.embed.runtimes.export import (
    GRAPH_FILE,
    Artifact,
    build_cached,
    library_versions,
    onnx_export,
)
from embedder.tasks.embed.runtimes.graph import (
    Feeds,
    GraphRuntime,
    RunGraph,
    chosen_precision,
    threads_for,
)
from embedder.tasks.embed.spec import EncoderSpec

log = logging.getLogger(__name__)

RunGraphFrom = Callable[[Path], RunGraph]

# Model types whose layers ONNX Runtime's "bert" optimizer fuses (they share BERT's graph).
FUSABLE = frozenset({"bert", "roberta", "xlm-roberta", "electra"})
FUSION_VERSION = 1
QUANTIZATION_VERSION = 1
BF16 = "ONNX Runtime's CPU provider has no bf16 arithmetic"
REFUSALS = {
    "bfloat16": BF16,
    "bfloat16-autocast": BF16,
    "float16": "fp16 graphs are not built for this runtime",
}


def cpu_has_vnni() -> bool:
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def fused(export: Artifact) -> tuple[Path, str]:
    meta = export.meta
    if meta.get("model_type") not in FUSABLE:
        return export.folder / GRAPH_FILE, "float32"
    identity: dict[str, object] = {
        "from": export.key,
        "fusion": FUSION_VERSION,
        "libraries": library_versions("onnxruntime"),
    }

    def build(out: Path) -> dict[str, object]:
        from onnxruntime.transformers.optimizer import optimize_model

        # opt_level 0: only the optimizer's own fusions, so the file stays portable; the
        # session applies the CPU-specific rewrites when it loads.
        model = optimize_model(
            str(export.folder / GRAPH_FILE),
            model_type="bert",
            num_heads=int(str(meta["num_attention_heads"])),
            hidden_size=int(str(meta["hidden_size"])),
            opt_level=0,
        )
        model.save_model_to_file(str(out / GRAPH_FILE))
        return {"fused": {k: v for k, v in model.get_fused_operator_statistics().items() if v}}

    artifact = build_cached("ort-fp32", identity, build)
    return artifact.folder / GRAPH_FILE, "float32 (onnxruntime, fused attention)"


def quantized(export: Artifact) -> tuple[Path, str]:
    from onnxruntime.quantization import QuantType

    source, _ = fused(export)
    weights = QuantType.QInt8 if cpu_has_vnni() else QuantType.QUInt8
    identity: dict[str, object] = {
        "from": export.key,
        "graph": source.parent.name,
        "quantization": QUANTIZATION_VERSION,
        "weights": weights.name,
        "per_channel": True,
        "libraries": library_versions("onnxruntime", "onnx"),
    }

    def build(out: Path) -> dict[str, object]:
        from onnx import TensorProto
        from onnxruntime.quantization import quantize_dynamic

        with _quiet_root_logging("onnxruntime"):
            quantize_dynamic(
                source,
                out / GRAPH_FILE,
                per_channel=True,
                weight_type=weights,
                # Shape inference cannot see through the fused (com.microsoft) operators;
                # every tensor it loses track of is float.
                extra_options={"DefaultTensorType": TensorProto.FLOAT},
            )
        return {"weights": weights.name}

    artifact = build_cached("ort-int8", identity, build)
    return artifact.folder / GRAPH_FILE, f"int8 (onnxruntime dynamic, {weights.name} weights)"


PRECISIONS = {"float32": fused, "int8": quantized}


@contextlib.contextmanager
def _quiet_root_logging(package: str) -> Iterator[None]:
    """Drop what ``package`` logs straight on the root logger (the quantizer logs a line
    per tensor there) without touching anyone else's records."""
    marker = f"{os.sep}{package}{os.sep}"

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or marker not in record.pathname

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def _providers(device: DeviceKind, dtype: str) -> list[str]:
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise FleetError(
            "runtime 'onnx' on cuda needs ONNX Runtime's CUDA execution provider, which this "
            "onnxruntime lacks: install onnxruntime-gpu, or use runtime torch"
        )
    if dtype == "int8":
        raise FleetError(
            "runtime 'onnx': dynamic int8 runs on the CPU provider only; use float32 on cuda"
        )
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


def _compiler(spec: EncoderSpec, device: DeviceKind, threads: int, dtype: str) -> RunGraphFrom:
    """Opens a graph file as a function from feeds to outputs, with this profile's options."""
    providers = _providers(device, dtype)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads_for(spec, device, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # ONNX Runtime's own warnings are about the graph, not us

    def compile_graph(graph: Path) -> RunGraph:
        session = ort.InferenceSession(str(graph), options, providers=providers)
        names = [i.name for i in session.get_inputs()]  # an unused input may be pruned

        def run(feeds: Feeds) -> NDArray[np.float32]:
            out = session.run(None, {name: feeds[name] for name in names})[0]
            return np.asarray(out, dtype=np.float32)

        return run

    return compile_graph


def load(spec: EncoderSpec, device: DeviceKind, threads: int) -> GraphRuntime:
    dtype = chosen_precision(spec, device, "onnx", PRECISIONS, REFUSALS)
    compile_graph = _compiler(spec, device, threads, dtype)
    export = onnx_export(spec)
    graph, label = PRECISIONS[dtype](export)
    run = compile_graph(graph)
    log.info("%s: onnx %s from %s", spec.name, label, graph)
    runtime = GraphRuntime(spec, export, run, runtime="onnx", device=device, dtype=label)
    runtime.serve_adapters(export, lambda merged: PRECISIONS[dtype](merged)[0], compile_graph)
    return runtime
