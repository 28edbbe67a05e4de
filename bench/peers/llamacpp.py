"""llama.cpp through its Python binding (``llama-cpp-python``): the peer users
pick for a small GGUF model on CPU, measured by ``bench.generate``.

It is a generation peer, so it is not in ``PEERS`` (those serve embeddings to
``bench.served``). PyPI serves only its source: the install builds llama.cpp
with cmake into its own venv (``python -m bench.peers.llamacpp install``,
about 15 minutes on 2 cores), outside flotilla's environment.

Its server (``python -m llama_cpp.server``) runs one completion at a time
behind a lock: the binding offers no parallel slots and no continuous
batching (llama.cpp's own C++ server does; the binding's does not). Its
default ``interrupt_requests=True`` cancels the running stream whenever a new
request arrives, which under concurrent clients turns most streams into
truncated ones, so it is switched off: requests wait their turn instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.peers import Launch, peers_dir
from bench.peers.server import running

HOST = "127.0.0.1"
VERSION = "0.3.36"  # the newest PyPI served when pinned; it built with gcc 12 and cmake


@dataclass(frozen=True)
class GenerationStart:
    """How to start a generation peer on a GGUF file."""

    gguf: Path
    model_name: str  # the name requests carry
    port: int
    threads: int
    n_ctx: int  # context tokens; one sequence at a time, so one sequence's worth
    log_path: Path
    ready_timeout_s: float


@dataclass(frozen=True)
class Step:
    argv: list[str]
    env: dict[str, str]


class LlamaCpp:
    name = "llama-cpp-python"
    version = VERSION

    def venv(self) -> Path:
        return peers_dir() / f"llama-cpp-python-{self.version}"

    def python(self) -> Path:
        return self.venv() / "bin" / "python"

    def missing(self) -> str | None:
        if (self.venv() / ".installed").is_file() and self.python().is_file():
            return None
        return (
            f"llama-cpp-python {self.version} is not installed in {self.venv()}; run "
            f"python -m bench.peers.llamacpp install"
        )

    def install_steps(self, base_python: str, jobs: int, cmake_args: str = "") -> list[Step]:
        """The commands that build and install it, in order (the marker is written
        after the last, so a half-finished install is redone)."""
        venv, python = self.venv(), str(self.python())
        build_env = {"CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
        if cmake_args:
            build_env["CMAKE_ARGS"] = cmake_args
        return [
            Step([base_python, "-m", "venv", str(venv)], {}),
            Step([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], {}),
            Step(
                [
                    python,
                    "-m",
                    "pip",
                    "install",
                    "--no-binary",
                    "llama-cpp-python",  # from source: llama.cpp compiled for this CPU
                    f"llama-cpp-python[server]=={self.version}",
                ],
                build_env,
            ),
            Step([python, "-c", "import llama_cpp.server.app"], {}),
        ]

    def install(self, base_python: str, jobs: int, cmake_args: str = "") -> None:
        if self.missing() is None:
            print(f"llama-cpp-python {self.version} already installed in {self.venv()}")
            return
        self.venv().parent.mkdir(parents=True, exist_ok=True)
        for step in self.install_steps(base_python, jobs, cmake_args):
            print("+", " ".join(step.argv))
            env = {**os.environ, **step.env}
            env.pop("PYTHONPATH", None)
            subprocess.run(step.argv, env=env, check=True)
        frozen = subprocess.run(
            [str(self.python()), "-m", "pip", "freeze"], check=True, capture_output=True, text=True
        )
        (self.venv() / ".installed").write_text(frozen.stdout, encoding="utf-8")
        print(f"llama-cpp-python {self.version} installed in {self.venv()}")

    def command(self, start: GenerationStart) -> list[str]:
        threads = str(start.threads)
        return [
            str(self.python()),
            "-m",
            "llama_cpp.server",
            "--model",
            str(start.gguf),
            "--model_alias",
            start.model_name,
            "--n_ctx",
            str(start.n_ctx),
            "--n_threads",
            threads,
            "--n_threads_batch",
            threads,
            "--interrupt_requests",
            "False",
            "--verbose",
            "False",
            "--host",
            HOST,
            "--port",
            str(start.port),
        ]

    @contextlib.contextmanager
    def serve(self, start: GenerationStart) -> Iterator[Launch]:
        env = {**os.environ, "OMP_NUM_THREADS": str(start.threads)}
        env.pop("PYTHONPATH", None)  # its venv, not flotilla's code
        url = f"http://{HOST}:{start.port}"
        with running(
            self.command(start), env, start.log_path, f"{url}/v1/models", start.ready_timeout_s,
            "llama.cpp",
        ) as process:  # fmt: skip
            yield Launch(f"{url}/v1/chat/completions", start.model_name, process.pid)


PEER = LlamaCpp()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.llamacpp",
        description=f"Build and install llama-cpp-python {VERSION} into its own venv.",
    )
    sub = parser.add_subparsers(dest="what", required=True)
    install = sub.add_parser("install", help="build it from source (skips when installed)")
    install.add_argument("--python", default="python3", help="the venv's base interpreter")
    install.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build jobs")
    install.add_argument("--cmake-args", default="", help="CMAKE_ARGS, e.g. -DGGML_CUDA=on")
    sub.add_parser("path", help="print the venv's directory")
    args = parser.parse_args(argv)
    if args.what == "path":
        print(PEER.venv())
        return
    try:
        PEER.install(args.python, args.jobs, args.cmake_args)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"the install failed ({exc.returncode}): {' '.join(exc.cmd)}")


if __name__ == "__main__":
    main()
