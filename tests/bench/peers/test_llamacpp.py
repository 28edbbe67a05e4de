"""The llama.cpp peer: how it is installed, how its server is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers import llamacpp


@pytest.fixture
def peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLOTILLA_PEERS_DIR", str(tmp_path))
    return tmp_path


def test_the_install_builds_the_pinned_version_from_source_in_its_own_venv(peers: Path) -> None:
    venv = peers / f"llama-cpp-python-{llamacpp.VERSION}"
    python = str(venv / "bin" / "python")
    steps = llamacpp.PEER.install_steps("python3.11", jobs=2)
    assert steps[0].argv == ["python3.11", "-m", "venv", str(venv)]
    assert all(step.argv[0] == python for step in steps[1:])  # never flotilla's pip
    build = steps[2]
    assert build.argv[1:] == [
        "-m",
        "pip",
        "install",
        "--no-binary",
        "llama-cpp-python",
        f"llama-cpp-python[server]=={llamacpp.VERSION}",
    ]
    assert build.env == {"CMAKE_BUILD_PARALLEL_LEVEL": "2"}
    assert steps[-1].argv == [python, "-c", "import llama_cpp.server.app"]
    cuda = llamacpp.PEER.install_steps("python3", jobs=8, cmake_args="-DGGML_CUDA=on")[2]
    assert cuda.env == {"CMAKE_BUILD_PARALLEL_LEVEL": "8", "CMAKE_ARGS": "-DGGML_CUDA=on"}


def test_it_is_missing_until_the_marker_is_written(peers: Path) -> None:
    missing = llamacpp.PEER.missing()
    assert missing is not None and "python -m bench.peers.llamacpp install" in missing
    python = llamacpp.PEER.python()
    python.parent.mkdir(parents=True)
    python.touch()
    assert llamacpp.PEER.missing() is not None  # a half-finished install
    (llamacpp.PEER.venv() / ".installed").write_text("llama_cpp_python==0.3.36\n")
    assert llamacpp.PEER.missing() is None


def test_the_server_takes_requests_in_turn_on_the_given_threads(peers: Path) -> None:
    start = llamacpp.GenerationStart(
        gguf=Path("/m/model.gguf"),
        model_name="smollm2-135m-instruct",
        port=8123,
        threads=2,
        n_ctx=2048,
        log_path=peers / "log",
        ready_timeout_s=10,
    )
    argv = llamacpp.PEER.command(start)
    assert argv[:3] == [str(llamacpp.PEER.python()), "-m", "llama_cpp.server"]
    options = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert options == {
        "--model": "/m/model.gguf",
        "--model_alias": "smollm2-135m-instruct",
        "--n_ctx": "2048",
        "--n_threads": "2",
        "--n_threads_batch": "2",
        "--interrupt_requests": "False",  # its default cancels a stream per new request
        "--verbose": "False",
        "--host": "127.0.0.1",
        "--port": "8123",
    }


def test_the_path_command_prints_the_venv(peers: Path, capsys: pytest.CaptureFixture[str]) -> None:
    llamacpp.main(["path"])
    assert capsys.readouterr().out.strip() == str(llamacpp.PEER.venv())
