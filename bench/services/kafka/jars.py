"""Resolve the broker's jars (pinned in pom.xml) from Maven Central into a cache outside the
repo, once per pom: a marker holding the pom's digest says the directory is complete.

``python -m bench.services.kafka.jars`` resolves and prints the directory (``make kafka-jars``).
The cache root is ``$FLOTILLA_KAFKA_CACHE``, else ``$XDG_CACHE_HOME/flotilla``, else
``~/.cache/flotilla``; the jars land in ``<root>/kafka-<version>/libs``."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.services.cache import cache_root as shared_cache_root
from bench.services.cache import locked

POM = Path(__file__).with_name("pom.xml")
MARKER = ".flotilla-complete"
_MAVEN_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


class KafkaSetupError(RuntimeError):
    """The broker cannot be provided: a missing tool, a failed resolution or start."""


def kafka_version(pom: Path = POM) -> str:
    version = ET.parse(pom).getroot().findtext("m:properties/m:kafka.version", None, _MAVEN_NS)
    if not version:
        raise KafkaSetupError(f"{pom} has no <kafka.version> property")
    return version.strip()


def cache_root() -> Path:
    return shared_cache_root("FLOTILLA_KAFKA_CACHE")


def libs_dir(pom: Path = POM) -> Path:
    return cache_root() / f"kafka-{kafka_version(pom)}" / "libs"


def _digest(pom: Path) -> str:
    # Of the canonical XML without comments: rewording the pom's prose must not fetch the
    # same jars again.
    canonical = ET.canonicalize(from_file=str(pom), with_comments=False, strip_text=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _is_complete(libs: Path, digest: str) -> bool:
    marker = libs / MARKER
    return marker.is_file() and marker.read_text().strip() == digest


def ensure_jars(pom: Path = POM) -> Path:
    """The directory holding every runtime jar of the pinned broker; resolves it with Maven
    when missing or made from another pom. Raises KafkaSetupError when that fails."""
    libs = libs_dir(pom)
    digest = _digest(pom)
    if _is_complete(libs, digest):
        return libs
    with locked(libs.parent / ".lock"):
        if _is_complete(libs, digest):
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaSetupError(
                "Maven (mvn) is needed once to fetch the Kafka broker's jars from Maven "
                f"Central into {libs}; install it (and Java 17+) or fill that directory."
            )
        partial = libs.with_name(f"libs.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not any(partial.glob("kafka_2.13-*.jar")):
            shutil.rmtree(partial, ignore_errors=True)
            raise KafkaSetupError(
                f"resolving the Kafka jars failed (exit {done.returncode}): {' '.join(command)}"
                f"\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
            )
        (partial / MARKER).write_text(digest + "\n")
        shutil.rmtree(libs, ignore_errors=True)
        partial.rename(libs)
    return libs


def main() -> None:
    started = time.perf_counter()
    cached = _is_complete(libs_dir(), _digest(POM))
    libs = ensure_jars()
    how = "cached" if cached else f"resolved in {time.perf_counter() - started:.1f} s"
    print(f"kafka {kafka_version()} jars: {libs} ({how})")


if __name__ == "__main__":
    main()
