"""What a correct answer holds: each text's vector from the same weights loaded alone, in
this process, in fp32 (flotilla's torch runtime on the folder the entries resolve to),
computed once per set of weights over the benchmark's few texts. Every 200 is checked
against them, whatever entry, runtime or precision served it.

The bound is per precision: fp32 entries (torch, ONNX Runtime, OpenVINO) must give the
same vectors up to summation order; a bf16 entry's vectors move by its rounding, so its
bound is looser (the runtimes' own accuracy guard for a precision below fp32 is 0.999 on
calibration texts; these texts are other ones)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from bench import texts
from embedder.core.fleet import Fleet
from embedder.tasks.embed.spec import EncoderSpec

MIN_COSINE = {"float32": 0.999, "bfloat16": 0.995, "int8": 0.98}
TEXTS = 48  # the texts requests draw from: few, so the references are cheap
MAX_CHARS = 400  # short texts: a request is small, what it asks of memory is the model

References = NDArray[np.float32]  # (TEXTS, dim) unit vectors, in the order of the texts


def bench_texts(count: int = TEXTS, seed: int = texts.SEED) -> list[str]:
    """``count`` prose sentences of the bundled corpus, a fixed draw for a seed."""
    pool = [s for s in texts.sentences() if len(s) <= MAX_CHARS]
    rng = np.random.default_rng(seed)
    return [pool[int(i)] for i in rng.choice(len(pool), size=count, replace=False)]


def min_cosine(dtype: str) -> float:
    return MIN_COSINE.get(dtype, MIN_COSINE["int8"])


def references(spec: EncoderSpec, inputs: Sequence[str], threads: int) -> References:
    """The unit vectors of ``inputs`` from ``spec``'s weights in fp32 on the CPU, with the
    prompt a request that names none gets (e5's "query: ")."""
    from embedder.tasks.embed.runtimes import load_runtime

    profile = spec.profile("cpu").model_copy(update={"runtime": "torch", "dtype": "float32"})
    alone = spec.model_copy(update={"profiles": {"cpu": profile}})
    runtime = load_runtime(alone, "cpu", threads)
    vectors = runtime.forward(runtime.tokenize(list(inputs), "right", spec.prompt_prefix()))
    del runtime
    return unit(vectors)


def references_for(
    bundled: Fleet, weights: dict[str, str], inputs: Sequence[str], threads: int
) -> dict[str, References]:
    """References per set of weights (short name -> the bundled model it names)."""
    out: dict[str, References] = {}
    for short, model in weights.items():
        spec = bundled.get(model)
        assert isinstance(spec, EncoderSpec)
        out[short] = references(spec, inputs, threads)
    return out


def unit(vectors: NDArray[np.floating]) -> NDArray[np.float32]:
    v = np.asarray(vectors, dtype=np.float32)
    out: NDArray[np.float32] = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return out


def answer_vectors(payload: bytes) -> NDArray[np.float32]:
    """The vectors of a 200 to a base64 /v1/embeddings request, in input order;
    ValueError (or KeyError) when the body is not one."""
    data = sorted(json.loads(payload)["data"], key=lambda item: item["index"])
    if not data:
        raise ValueError("no vectors in the answer")
    return np.stack(
        [np.frombuffer(base64.b64decode(item["embedding"]), np.float32) for item in data]
    )


def worst_cosine(got: NDArray[np.float32], inputs: Sequence[int], refs: References) -> float:
    """The smallest cosine between an answer's vectors and the references of the texts
    it was asked for; -1 when the answer has the wrong number or size of vectors."""
    if got.ndim != 2 or got.shape[0] != len(inputs) or got.shape[1] != refs.shape[1]:
        return -1.0
    return float((unit(got) * refs[list(inputs)]).sum(axis=1).min())
