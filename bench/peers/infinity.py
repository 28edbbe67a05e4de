"""Infinity (``infinity-emb``), started from its own venv as a subprocess.

Its torch engine (its ONNX engine mis-truncated inputs in a trial), the
same local model folder flotilla serves, offline, telemetry off, and its CPU
threads capped at ``--threads`` as flotilla's are. ``--served-model-name`` is
the fleet's model name, so the benchmark's request bodies serve both servers
unchanged. Its ``--help`` shows wrong defaults: every knob that matters is
passed explicitly.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from bench.peers import Launch, Start, peers_dir
from bench.peers.server import running

HOST = "127.0.0.1"
SCRIPT = Path(__file__).with_name("infinity.sh")


class Infinity:
    name = "infinity"
    version = "0.0.78"

    def venv(self) -> Path:
        return peers_dir() / f"infinity-{self.version}"

    def missing(self) -> str | None:
        venv = self.venv()
        if (venv / ".installed").is_file() and (venv / "bin" / "infinity_emb").is_file():
            return None
        return f"infinity-emb {self.version} is not installed in {venv}; run {SCRIPT}"

    def command(self, start: Start) -> list[str]:
        return [
            str(self.venv() / "bin" / "infinity_emb"),
            "v2",
            "--model-id",
            str(start.model_dir),
            "--served-model-name",
            start.model_name,
            "--engine",
            "torch",
            "--device",
            start.device,
            "--dtype",
            start.config.dtype,
            "--batch-size",
            str(start.config.batch_size),
            "--host",
            HOST,
            "--port",
            str(start.port),
            "--no-vector-disk-cache",
            "--log-level",
            "warning",  # as flotilla runs: no access line per request
        ]

    @contextlib.contextmanager
    def serve(self, start: Start) -> Iterator[Launch]:
        env = {
            **os.environ,
            "DO_NOT_TRACK": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": str(start.threads),
            "MKL_NUM_THREADS": str(start.threads),
        }
        env.pop("PYTHONPATH", None)  # its venv, not flotilla's code
        url = f"http://{HOST}:{start.port}"
        with running(
            self.command(start), env, start.log_path, f"{url}/health", start.ready_timeout_s,
            "infinity",
        ) as process:  # fmt: skip
            yield Launch(f"{url}/embeddings", start.model_name, process.pid)


PEER = Infinity()
