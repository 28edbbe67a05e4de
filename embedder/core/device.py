"""A stable key for "this kind of device", so a profile tuned on one machine is used on
every machine like it and on no other.

A CPU is its model name, the instruction-set flags that change which kernels are fastest
(bf16 and int8 dot products, AMX tiles, the vector width) and the cores this process may
use; a GPU is its name. The key is readable and a plain string, e.g.
``cpu:amd-epyc:avx2+avx512_bf16+avx512_vnni+avx512f+avx_vnni:2c``. Torch-free for CPUs:
the gateway side can compute it; only a CUDA fingerprint imports torch.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from embedder.core.fleet import DeviceKind

# The flags that decide what is fastest: bf16 / int8 arithmetic and the vector width.
# Others (sse4, aes, ...) are on every CPU flotilla runs on, or change nothing it runs.
SPEED_FLAGS = (
    "amx_bf16",
    "amx_int8",
    "avx2",
    "avx512_bf16",
    "avx512_vnni",
    "avx512f",
    "avx_vnni",
)
CPUINFO = Path("/proc/cpuinfo")


def _slug(name: str) -> str:
    """'AMD EPYC 7B13 64-Core Processor' -> 'amd-epyc-7b13-64-core-processor'."""
    name = re.sub(r"\((?:R|TM|tm)\)", "", name)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """The first processor's model name and flags, from /proc/cpuinfo's text."""
    model, flags = "unknown", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key in ("flags", "Features") and not flags:  # x86, ARM
            flags = frozenset(value.split())
        if model != "unknown" and flags:
            break
    return model, flags


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def read_cpuinfo() -> str:
    """/proc/cpuinfo's text; empty where there is none (not Linux)."""
    try:
        return CPUINFO.read_text(encoding="ascii", errors="ignore")
    except OSError:
        return ""


def cpu_model() -> str:
    """This CPU's model name, named beside every figure measured on it; where
    /proc/cpuinfo has none (macOS, many ARM boards) the platform's processor name."""
    model = parse_cpuinfo(read_cpuinfo())[0]
    return model if model != "unknown" else (platform.processor() or "unknown")


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (avx512_bf16, avx512_vnni, ...): what runtimes check
    before choosing kernels."""
    return parse_cpuinfo(read_cpuinfo())[1]


def cpu_fingerprint(cpuinfo: str | None = None, cores: int | None = None) -> str:
    """``cpu:<model>:<speed flags joined by +, or 'none'>:<cores>c``. ``cpuinfo`` is the
    text of /proc/cpuinfo (read when not given; 'unknown' where there is none)."""
    model, flags = parse_cpuinfo(read_cpuinfo() if cpuinfo is None else cpuinfo)
    speed = "+".join(sorted(flags.intersection(SPEED_FLAGS))) or "none"
    return f"cpu:{_slug(model)}:{speed}:{cores if cores is not None else usable_cores()}c"


def cuda_fingerprint(index: int = 0) -> str:
    """``cuda:<gpu name>``, e.g. ``cuda:nvidia-h100-80gb-hbm3``; imports torch."""
    import torch

    return f"cuda:{_slug(torch.cuda.get_device_name(index))}"


def fingerprint(device: DeviceKind) -> str:
    """The key of this machine's device of that kind."""
    return cuda_fingerprint() if device == "cuda" else cpu_fingerprint()
