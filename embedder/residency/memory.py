"""What the models hold on the device, measured: the process's resident set on a CPU,
the allocator's bytes on CUDA; and the budget the fleet may use.

A model's memory is what its load added (``used()`` after less before, loads one at a
time), so the budget counts what models cost on this device with this runtime and
precision, not what their files weigh. Freed memory is handed back (``release``): on a
CPU glibc keeps freed heap pages in the process until ``malloc_trim`` returns them, so
without it an evicted model would still count in the resident set; on CUDA torch's
caching allocator keeps freed blocks until ``empty_cache``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
from pathlib import Path
from typing import Protocol

from embedder.core.fleet import DeviceKind

log = logging.getLogger(__name__)

MB = 1024 * 1024
CPU_SHARE = 0.8  # of the memory available to processes, when no budget is set
CUDA_SHARE = 0.9  # of the card's free memory, when no budget is set
# Files whose size stands for a model's memory before it has loaded once (a first guess:
# the measured size replaces it after its first load).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".gguf", ".pt", ".xml")


class MemoryMeter(Protocol):
    def used(self) -> int:
        """Bytes this process holds on the device now."""

    def release(self) -> None:
        """Hand memory freed by an unloaded model back, so ``used`` shows it gone."""

    def settle(self) -> None:
        """Hand back what the allocator keeps of memory already freed (cheap: no collector
        pass), so that a load measured next does not reuse it unseen."""

    def reset_peak(self) -> None:
        """Start a new ``peak``: from now, the most ``used`` reaches."""

    def peak(self) -> int:
        """The most this process held since ``reset_peak`` (a load's transient copies:
        a file read whole before its tensors, a graph optimized beside the original)."""


class CpuMemory:
    """The process's resident set (``/proc/self/statm``)."""

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name) if name else None
        self._trim = getattr(libc, "malloc_trim", None)  # glibc only

    def used(self) -> int:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * self._page

    def reset_peak(self) -> None:
        try:  # "5" resets the high-water mark (Linux 4.0); without it the peak is older
            Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
        except OSError as exc:
            log.debug("cannot reset the resident set's peak: %s", exc)

    def peak(self) -> int:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return self.used()

    def release(self) -> None:
        gc.collect()  # a model's modules hold reference cycles: they go with a pass
        self.settle()

    def settle(self) -> None:
        if self._trim is not None:
            self._trim(0)


class CudaMemory:
    """torch's allocated bytes on the current CUDA device."""

    def used(self) -> int:
        import torch

        return int(torch.cuda.memory_allocated())

    def release(self) -> None:
        gc.collect()
        self.settle()

    def settle(self) -> None:
        import torch

        torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated())


M_ARENA_MAX = -8  # glibc's mallopt parameter
ARENAS = 2  # heaps glibc's malloc may keep for this process's threads


def limit_arenas(arenas: int = ARENAS) -> None:
    """Keep glibc's malloc to ``arenas`` heaps for this process's threads.

    A load runs in one thread and batches in others; with a heap per thread (glibc's
    default: up to eight per core) what an evicted model freed is scattered over heaps
    that ``malloc_trim`` hands back only in part. Measured on a 2-core Xeon, an evicted
    MiniLM (85 MB) handed back 10 to 15 MB in two runs of four by default, 55 to 58 MB in
    every run with two heaps (tests/embedder/test_host_memory.py). glibc reads the limit
    when a thread first needs a heap of its own: call it before any thread starts (the
    ``flotilla`` command does, first thing). It does nothing without glibc."""
    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is not None:
        mallopt(M_ARENA_MAX, arenas)


def meter_for(device: DeviceKind) -> MemoryMeter:
    return CudaMemory() if device == "cuda" else CpuMemory()


def budget_bytes(budget_mb: float, device: DeviceKind) -> int:
    """``budget_mb`` in bytes; 0 takes a share of what the device has free now."""
    if budget_mb > 0:
        return int(budget_mb * MB)
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        return int(free * CUDA_SHARE)
    return int(available_cpu_bytes() * CPU_SHARE)


def available_cpu_bytes() -> int:
    """MemAvailable of /proc/meminfo: what processes may still take without swapping."""
    for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            return int(value.split()[0]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def weights_bytes(folder: Path) -> int:
    """The size of the weight files under ``folder``: a model's memory before it has been
    measured. A quantized file (GGUF) loads larger than it weighs; the measure after its
    first load corrects the guess."""
    return sum(
        path.stat().st_size
        for path in folder.rglob("*")
        if path.suffix in WEIGHT_SUFFIXES and path.is_file()
    )
