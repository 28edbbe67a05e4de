"""LoRA adapters on the exported-graph runtimes (ONNX Runtime, OpenVINO): one graph per
adapter, the adapter merged into the weights, built in the background.

Why merged graphs: once its low-rank update is added into the weights, an adapter costs
nothing at run time, so adapter rows run at the base graph's speed, and each runtime
derives and compiles an adapter's graph exactly as it does the base's (same precision,
threads, fusion, int8). The price: a compiled graph in memory per resident adapter
(``max_resident_adapters`` caps them) and, the first time an adapter is used on a
machine, a build of tens of seconds (load the torch model, merge, export, then the
runtime's own form). Builds are cached by content hash (``export.build_cached``): a
later start only compiles.

Builds never run on the device thread. ``load_adapter`` starts one on a daemon thread at
the lowest CPU priority and raises ``AdapterBuilding`` (with the build's future) until
it is done; the worker holds that adapter's requests and runs them once the graph is
ready, within their deadlines (``pipeline``), while base requests and ready adapters go
on. ``prepare`` starts the file build ahead of first use, without compiling (a compiled
graph is held only while the adapter is resident). One build at a time: two would only
share the same cores.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Generic, TypeVar

from embedder.core.errors import AdapterBuilding, AdapterInvalid, FlotillaError, InferenceFailed

log = logging.getLogger(__name__)

Run = TypeVar("Run")
LOWEST_PRIORITY = 19  # nice value of a build thread: the serving threads come first
_ONE_BUILD = threading.Lock()  # builds of every model in this process, one at a time


def _lowest_priority() -> None:
    """Lower this thread's CPU priority (Linux: a thread id is a valid target)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
    except (AttributeError, OSError):  # another OS: the build just competes evenly
        log.debug("could not lower the adapter build thread's priority")


def in_background(name: str, work: Callable[[], Run]) -> Future[Run]:
    """``work()`` on its own daemon thread (a stopping process does not wait for it), at
    the lowest priority, after any other build; its result or error in the future."""
    future: Future[Run] = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        _lowest_priority()
        try:
            with _ONE_BUILD:
                future.set_result(work())
        except BaseException as exc:  # every failure reaches the requests that wait
            future.set_exception(exc)

    threading.Thread(target=run, name=f"adapter-build-{name}", daemon=True).start()
    return future


class AdapterGraphs(Generic[Run]):
    """One runtime's adapter graphs: builds under way, and the compiled runners of the
    resident adapters. Called from the device thread, and ``prepare`` from the loader."""

    def __init__(
        self,
        model: str,
        runtime: str,
        build: Callable[[str, Path], Path],
        compile_graph: Callable[[Path], Run],
    ) -> None:
        self.model = model
        self.runtime = runtime
        self._build = build  # (name, folder) -> the runtime's graph file, built or cached
        self._compile = compile_graph
        self._lock = threading.Lock()
        self._builds: dict[tuple[str, Path, bool], Future[Run | None]] = {}
        self.resident: dict[str, Run] = {}

    def prepare(self, name: str, folder: Path) -> None:
        """Build the adapter's graph files ahead of its first request (nothing compiled)."""
        self._started(name, folder, compiled=False)

    def load(self, name: str, folder: Path) -> None:
        """Make the adapter resident, or AdapterBuilding while its graph is being built;
        a failed build raises its error here (once: the next load builds again)."""
        future = self._started(name, folder, compiled=True)
        if not future.done():
            raise AdapterBuilding(
                f"adapter {name!r} of model {self.model!r}: its graph for runtime "
                f"{self.runtime!r} (the adapter merged into the exported model) is being "
                "built, once per adapter; its requests run when it is ready",
                ready=future,
            )
        with self._lock:
            self._builds.pop((name, folder, True), None)
        run = future.result()
        assert run is not None, "a compiled build returns its runner"
        self.resident[name] = run

    def unload(self, name: str) -> None:
        self.resident.pop(name, None)

    def runner(self, name: str) -> Run:
        try:
            return self.resident[name]
        except KeyError:
            raise AdapterInvalid(f"adapter {name!r} is not loaded") from None

    def _started(self, name: str, folder: Path, *, compiled: bool) -> Future[Run | None]:
        key = (name, folder, compiled)
        with self._lock:
            future = self._builds.get(key)
            if future is None:
                future = in_background(name, lambda: self._built(name, folder, compiled))
                self._builds[key] = future
                if not compiled:  # nobody collects a file build: forget it when done
                    future.add_done_callback(lambda done: self._forget(key, done))
            return future

    def _forget(self, key: tuple[str, Path, bool], done: Future[Run | None]) -> None:
        with self._lock:
            self._builds.pop(key, None)
        if (error := done.exception()) is not None:  # its first request will say so too
            log.warning("adapter %r of model %r cannot serve: %s", key[0], self.model, error)

    def _built(self, name: str, folder: Path, compiled: bool) -> Run | None:
        try:
            path = self._build(name, folder)
            return self._compile(path) if compiled else None
        except FlotillaError:
            raise  # AdapterInvalid: the adapter does not fit the model
        except Exception as exc:
            log.exception("building the graph of adapter %r on %s failed", name, self.model)
            raise InferenceFailed(
                f"adapter {name!r} of model {self.model!r}: building its graph for runtime "
                f"{self.runtime!r} failed: {exc!r}"
            ) from exc
