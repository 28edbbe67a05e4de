"""The fonts the OCR page set renders with, from Debian's font packages.

The build machines carry DejaVu only, and a set rendered from whatever fonts a
machine has would not compare across machines. So the packages are pinned
(version and SHA256, from Debian 12's archive) and fetched once with
``apt-get download``, checked, and unpacked with ``dpkg-deb -x`` into a cache
outside the repo (``$FLOTILLA_FONTS_CACHE``, else ``$XDG_CACHE_HOME/flotilla``
or ``~/.cache/flotilla``, then ``fonts/<package>_<version>/``); a marker file
says an unpacked package is complete, so later runs touch nothing.

``python -m bench.ocr_data.fonts`` fetches them and prints the paths
(``make ocr-fonts``). Every font listed has the German letters (ä ö ü ß Ä Ö Ü)
and ``§``; a test checks it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.services.cache import cache_root as shared_cache_root
from bench.services.cache import locked

MARKER = ".flotilla-complete"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str  # of the .deb, as Debian 12's Packages index lists it

    @property
    def key(self) -> str:
        return f"{self.name}_{self.version}"


PACKAGES: dict[str, Package] = {
    p.name: p
    for p in (
        Package(
            "fonts-dejavu-core",
            "2.37-6",
            "8892669e51aab4dc56682c8e39d8ddb7d70fad83c369344e1e240bf3ca22bb76",
        ),
        Package(
            "fonts-liberation2",
            "2.1.5-1",
            "35ffaa54f117e633e89a5da89af235a073b34dbe582726fbf6989568f7fd9bda",
        ),
        Package(
            "fonts-noto-core",
            "20201225-1",
            "58f4f0bb6720f919f92096b3508e1412a0f1544424ade6c5b5bf1eb694dd64ba",
        ),
        Package(
            "fonts-freefont-ttf",
            "20120503-10",
            "4ca1c21ebc479198a3a5879d236c8317d6f7b2f1c403f7890e24c02eead05615",
        ),
    )
}


@dataclass(frozen=True)
class Font:
    name: str  # as results name it: "liberation-serif"
    style: str  # serif | sans | mono
    package: str
    file: str  # inside the unpacked package


_TTF = "usr/share/fonts/truetype"
FONTS: dict[str, Font] = {
    f.name: f
    for f in (
        Font("dejavu-sans", "sans", "fonts-dejavu-core", f"{_TTF}/dejavu/DejaVuSans.ttf"),
        Font("dejavu-serif", "serif", "fonts-dejavu-core", f"{_TTF}/dejavu/DejaVuSerif.ttf"),
        Font("dejavu-mono", "mono", "fonts-dejavu-core", f"{_TTF}/dejavu/DejaVuSansMono.ttf"),
        Font(
            "liberation-serif",
            "serif",
            "fonts-liberation2",
            f"{_TTF}/liberation2/LiberationSerif-Regular.ttf",
        ),
        Font(
            "liberation-sans",
            "sans",
            "fonts-liberation2",
            f"{_TTF}/liberation2/LiberationSans-Regular.ttf",
        ),
        Font(
            "liberation-mono",
            "mono",
            "fonts-liberation2",
            f"{_TTF}/liberation2/LiberationMono-Regular.ttf",
        ),
        Font("noto-serif", "serif", "fonts-noto-core", f"{_TTF}/noto/NotoSerif-Regular.ttf"),
        Font("noto-sans", "sans", "fonts-noto-core", f"{_TTF}/noto/NotoSans-Regular.ttf"),
        Font("free-serif", "serif", "fonts-freefont-ttf", f"{_TTF}/freefont/FreeSerif.ttf"),
        Font("free-mono", "mono", "fonts-freefont-ttf", f"{_TTF}/freefont/FreeMono.ttf"),
    )
}


class FontSetupError(RuntimeError):
    """The pinned fonts cannot be provided; the message says what is missing."""


def cache_root() -> Path:
    return shared_cache_root("FLOTILLA_FONTS_CACHE")


def package_dir(package: Package) -> Path:
    return cache_root() / "fonts" / package.key


def _is_complete(folder: Path, package: Package) -> bool:
    marker = folder / MARKER
    return marker.is_file() and marker.read_text().strip() == package.sha256


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise FontSetupError(
            f"{' '.join(command)} failed (exit {done.returncode}): "
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


def _fetch(package: Package, target: Path) -> None:
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise FontSetupError(
                f"{tool} is needed once to fetch {package.key} from Debian's archive into "
                f"{target}; run on a Debian-based machine or fill that directory by hand"
            )
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        _run(["apt-get", "download", f"{package.name}={package.version}"], work)
        debs = list(work.glob(f"{package.name}_*.deb"))
        if len(debs) != 1:
            raise FontSetupError(f"apt-get download left {debs} for {package.key}")
        digest = hashlib.sha256(debs[0].read_bytes()).hexdigest()
        if digest != package.sha256:
            raise FontSetupError(
                f"{debs[0].name} has SHA256 {digest}, the pin says {package.sha256}: "
                "the archive changed the package; check it and update the pin in "
                "bench/ocr_data/fonts.py"
            )
        unpacked = work / "root"
        _run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], work)
        (unpacked / MARKER).write_text(package.sha256 + "\n")
        shutil.rmtree(target, ignore_errors=True)
        unpacked.rename(target)


def ensure_package(package: Package) -> Path:
    """The unpacked package's root; fetched when missing. Raises FontSetupError."""
    folder = package_dir(package)
    if _is_complete(folder, package):
        return folder
    with locked(folder.parent / ".lock"):
        if not _is_complete(folder, package):
            _fetch(package, folder)
    return folder


def font_path(name: str) -> Path:
    """The file of the font ``name`` (see FONTS), its package fetched when missing."""
    try:
        font = FONTS[name]
    except KeyError:
        raise FontSetupError(f"unknown font {name!r}; known: {', '.join(FONTS)}") from None
    path = ensure_package(PACKAGES[font.package]) / font.file
    if not path.is_file():
        raise FontSetupError(f"{font.package} has no {font.file}")
    return path


def ensure_all() -> dict[str, Path]:
    return {name: font_path(name) for name in FONTS}


def main() -> None:
    for name, path in ensure_all().items():
        print(f"{name:18} {path}")


if __name__ == "__main__":
    main()
