"""The OpenVINO runtime: the model's exported ONNX graph converted to OpenVINO's own form
(cached beside the export), compiled for the CPU in f32, bf16 or int8.

The trap: on a CPU with AVX512-BF16 or AMX, OpenVINO runs f32 models in bf16 unless told
otherwise, so float32 pins ``INFERENCE_PRECISION_HINT`` to f32 and ``info`` reports what
the compiled model says it runs, not what was asked. bfloat16 asks for bf16. int8 is
NNCF post-training quantization (int8 weights and activations in the matmuls, scales
calibrated on a built-in set of mixed English and German texts), the rest pinned to f32;
'auto' never picks it, since int8 must pass the tuner's retrieval guard first.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import openvino as ov
from numpy.typing import NDArray

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

IR_FILE = "model.xml"
IR_VERSION = 1
QUANTIZATION_VERSION = 2
HINTS = {"float32": "f32", "bfloat16": "bf16", "int8": "f32"}
REFUSALS = {
    "bfloat16-autocast": "OpenVINO's bf16 is its inference precision; write dtype bfloat16",
    "float16": "fp16 is a GPU precision and this runtime compiles for the CPU",
}
CALIBRATION = (
    "The committee reviewed the annual budget and asked for a shorter report. "
    "Small language models answer questions about tax law, shipping schedules and the "
    "weather in coastal towns, and they do it quickly on modest hardware. "
    "Wer vorsätzlich oder fahrlässig das Leben, den Körper, die Gesundheit, die Freiheit, "
    "das Eigentum oder ein sonstiges Recht eines anderen widerrechtlich verletzt, ist dem "
    "anderen zum Ersatz des daraus entstehenden Schadens verpflichtet. "
    "How do I reset my password? Die Kündigung bedarf der Schriftform. "
)


def ir(export: Artifact) -> Path:
    """The export as an OpenVINO model, f32 weights kept (save_model would halve them)."""
    identity = {"from": export.key, "ir": IR_VERSION, "libraries": library_versions("openvino")}

    def build(out: Path) -> dict[str, object]:
        ov.save_model(
            ov.convert_model(export.folder / GRAPH_FILE), out / IR_FILE, compress_to_fp16=False
        )
        return {}

    return build_cached("openvino", identity, build).folder / IR_FILE


def calibration_feeds(runtime: GraphRuntime, batch: int = 4) -> list[Feeds]:
    """Mixed-length inputs, tokenized and padded as the runtime's own passes are."""
    words = CALIBRATION.split()
    texts = [" ".join(words[i % 50 : i % 50 + 3 + (i * 11) % 90]) for i in range(32)]
    if runtime.cross:
        encoded = runtime.tokenize_pairs(texts[0], texts, "right")
    else:
        encoded = runtime.tokenize(texts, "right")
    order = sorted(range(len(texts)), key=lambda i: len(encoded.ids[i]))
    return [runtime._feeds(encoded, order[i : i + batch]) for i in range(0, len(order), batch)]


def quantized(export: Artifact, calibration: list[Feeds]) -> Path:
    source = ir(export)
    identity = {
        "from": source.parent.name,
        "quantization": QUANTIZATION_VERSION,
        "libraries": library_versions("openvino", "nncf"),
    }

    def build(out: Path) -> dict[str, object]:
        import nncf
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            AdvancedSmoothQuantParameters,
        )

        nncf.set_log_level(logging.ERROR)
        model = ov.Core().read_model(source)
        names = [port.get_any_name() for port in model.inputs]
        data = [{n: f[n] for n in names} for f in calibration]
        # SmoothQuant off: on all-MiniLM-L6-v2 it cost accuracy (worst cosine to fp32
        # 0.968 with it, 0.984 without) and a third of the build time.
        no_smoothing = AdvancedQuantizationParameters(
            smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1)
        )
        q = nncf.quantize(
            model,
            nncf.Dataset(data),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(data),
            advanced_parameters=no_smoothing,
        )
        ov.save_model(q, out / IR_FILE, compress_to_fp16=False)
        return {"calibration_passes": len(data)}

    return build_cached("openvino-int8", identity, build).folder / IR_FILE


HINT_TYPES = {"float32": ov.Type.f32, "bfloat16": ov.Type.bf16, "int8": ov.Type.f32}
LABELS = {
    "float32": "float32 (openvino, f32 pinned)",
    "bfloat16": "bfloat16 (openvino inference precision)",
    "int8": "int8 (openvino nncf static, f32 elsewhere)",
}


def _runner(compiled: ov.CompiledModel) -> RunGraph:
    names = [port.get_any_name() for port in compiled.inputs]  # an unused input may be pruned

    def run(feeds: Feeds) -> NDArray[np.float32]:
        return np.asarray(compiled({name: feeds[name] for name in names})[0], dtype=np.float32)

    return run


def _not_compiled(feeds: Feeds) -> NDArray[np.float32]:
    raise RuntimeError("the OpenVINO model is not compiled yet")


RUNTIME_CACHE_SHAPES = 64


def prepare(device: DeviceKind) -> None:
    """Load the CPU plugin, once per process (its libraries are no model's memory)."""
    ov.Core().get_versions("CPU")


def load(spec: EncoderSpec, device: DeviceKind, threads: int) -> GraphRuntime:
    if device != "cpu":
        raise FleetError(
            f"model {spec.name!r}: runtime 'openvino' compiles for the CPU; on {device} use "
            "runtime torch or onnx"
        )
    dtype = chosen_precision(spec, device, "openvino", HINTS, REFUSALS)
    export = onnx_export(spec)
    config: dict[str, object] = {
        "INFERENCE_PRECISION_HINT": HINTS[dtype],
        "PERFORMANCE_HINT": "LATENCY",  # one stream: passes run one after another
        # The CPU plugin keeps an executor per input shape it has seen (5,000 by default);
        # served passes come in up to rows x width = 16 x 256 shapes, and the default cache
        # grew a MiniLM server's resident memory by 1.2 GB over 2,400 random shapes
        # (bench.soak: +23% after warm-up). 64 held it flat for about 3% of speed.
        "CPU_RUNTIME_CACHE_CAPACITY": str(RUNTIME_CACHE_SHAPES),
    }
    if n := threads_for(spec, device, threads):
        config["INFERENCE_NUM_THREADS"] = n
    runtime = GraphRuntime(spec, export, _not_compiled, runtime="openvino", device=device, dtype="")

    # int8 calibrates on inputs tokenized and padded by the runtime itself, tokenized here
    # once: an adapter's graph is built on another thread, and a tokenizer serves one.
    calibration = calibration_feeds(runtime) if dtype == "int8" else []

    def graph_file(artifact: Artifact) -> Path:
        return quantized(artifact, calibration) if dtype == "int8" else ir(artifact)

    def compile_graph(model: Path) -> RunGraph:
        return _runner(ov.Core().compile_model(model, "CPU", config))

    model = graph_file(export)
    compiled = ov.Core().compile_model(model, "CPU", config)
    runtime.run = _runner(compiled)
    runtime.serve_adapters(export, graph_file, compile_graph)
    runs = compiled.get_property("INFERENCE_PRECISION_HINT")
    label = LABELS[dtype] if runs == HINT_TYPES[dtype] else f"{dtype} asked, OpenVINO runs {runs}"
    runtime.info = dataclasses.replace(runtime.info, dtype=label)
    log.info("%s: openvino %s from %s", spec.name, label, model)
    return runtime
