"""The pinned Helm that renders and lints the chart in deploy/helm/flotilla (its tests:
tests/deploy/test_helm.py): built once with the Go toolchain from the Go module proxy
into a cache outside the repo; later runs reuse it.

``python -m deploy.helm_binary`` builds it when missing and prints its path (``make helm``).
The cache root is ``$XDG_CACHE_HOME/flotilla``, else ``~/.cache/flotilla``; the binary lands
in ``<root>/helm-<version>/helm``."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from bench.services.cache import cache_root, locked

MODULE = "helm.sh/helm/v4"
VERSION = "v4.3.2"
# Where the Go toolchain is installed when it is not on PATH.
GO_FALLBACK = Path("/usr/local/go/bin/go")


class HelmSetupError(RuntimeError):
    """The pinned helm cannot be provided: no Go toolchain, or its build failed."""


def helm_path() -> Path:
    """Where the pinned helm is (or will be, once built)."""
    return cache_root() / f"helm-{VERSION}" / "helm"


def _go() -> str:
    found = shutil.which("go") or (str(GO_FALLBACK) if GO_FALLBACK.is_file() else None)
    if found is None:
        raise HelmSetupError(
            f"the Go toolchain (go) is needed once to build helm {VERSION} from the Go "
            f"module proxy into {helm_path()}; install it, or put a helm {VERSION} there"
        )
    return found


def ensure_helm() -> Path:
    """The pinned helm binary; builds it when missing (minutes, once). Raises
    HelmSetupError when that fails."""
    helm = helm_path()
    if helm.is_file():
        return helm
    with locked(helm.parent.with_name(f".helm-{VERSION}.lock")):
        if helm.is_file():
            return helm
        partial = helm.parent.with_name(f"helm-{VERSION}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        # A static binary (no cgo), and the module's own build info rather than a VCS stamp.
        env = {
            **os.environ,
            "GOBIN": str(partial),
            "CGO_ENABLED": "0",
            "GOFLAGS": "-buildvcs=false",
        }
        # `go install` leaves helm's release version unstamped (`helm version` would say v4.3).
        stamp = f"-ldflags=-X {MODULE}/internal/version.version={VERSION}"
        command = [_go(), "install", stamp, f"{MODULE}/cmd/helm@{VERSION}"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not (partial / "helm").is_file():
            shutil.rmtree(partial, ignore_errors=True)
            raise HelmSetupError(
                f"building helm failed (exit {done.returncode}): {' '.join(command)}"
                f"\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
            )
        shutil.rmtree(helm.parent, ignore_errors=True)
        partial.rename(helm.parent)  # whole or not at all: a present binary is a built one
    return helm


def main() -> None:
    started = time.perf_counter()
    cached = helm_path().is_file()
    helm = ensure_helm()
    how = "cached" if cached else f"built in {time.perf_counter() - started:.0f} s"
    print(f"helm {VERSION}: {helm} ({how})")


if __name__ == "__main__":
    main()
