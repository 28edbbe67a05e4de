"""Commands check their arguments before loading any model, and load only the models
they use: `flotilla ingest` the ingest model, `eval retrieval` the models it compares."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from embedder.core.errors import ModelNotFound
from flotilla import wiring
from flotilla.cli import app
from flotilla.settings import Settings
from tests.fakes import fake_fleet

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "text": "t"}\n', encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--server", "http://127.0.0.1:8080"], "--server sends a file: give it with --from"),
        (["--produce"], "--produce sends a file"),
        (["--from", "{docs}", "--produce", "--server", "http://h:1"], "choose one"),
        (["--from", "{docs}", "--server", "127.0.0.1:8080"], "is not a server URL"),
        (["--from", "{docs}", "--server", "ftp://h/"], "is not a server URL"),
        (["--from", "{docs}", "--server", "http://h:99999"], "out of range"),
        (["--from", "{docs}", "--collection", "no spaces"], "collection name 'no spaces'"),
        (["--from", "{docs}.missing"], "is not a file"),
    ],
)
def test_ingest_refuses_bad_arguments_before_loading(
    docs: Path, args: list[str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*_: object, **__: object) -> None:
        raise AssertionError("a model stack was built")

    monkeypatch.setattr(wiring, "local_stack", never)
    arguments = [arg.replace("{docs}", str(docs)) for arg in args]
    result = CliRunner().invoke(app, ["ingest", *arguments], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split()), result.output


def two_models(tmp_path: Path) -> Settings:
    fleet = fake_fleet("first", "second", tmp=tmp_path)
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet.model_dump_json(), encoding="utf-8")  # JSON is YAML
    return Settings(fleet=path, data_dir=tmp_path / "data")


def test_ingest_loads_only_its_model(tmp_path: Path) -> None:
    settings = two_models(tmp_path)
    assert wiring.ingest_models(settings) == ["first"]
    stack = wiring.local_stack(settings, models=wiring.ingest_models(settings))
    assert list(stack.fleet.models) == ["first"]
    assert stack.core.rules.default_model == "first"
    assert list(wiring.local_stack(settings).fleet.models) == ["first", "second"]


def test_a_stack_of_named_models_takes_the_first_as_its_default(tmp_path: Path) -> None:
    settings = two_models(tmp_path)
    stack = wiring.local_stack(settings, models=["second", "second:some-adapter"])
    assert list(stack.fleet.models) == ["second"]
    assert stack.core.rules.default_model == "second"
    with pytest.raises(ModelNotFound, match="'third' is not in the fleet"):
        wiring.local_stack(settings, models=["third"])


def test_ingest_loads_the_fleets_ocr_model_for_scanned_documents() -> None:
    settings = Settings()
    assert wiring.ingest_models(settings) == ["all-minilm-l6-v2", "ppocrv5-mobile"]
    named = Settings(ingest_model="multilingual-e5-small", ingest_ocr_model="ocr")  # an alias
    assert wiring.ingest_models(named) == ["multilingual-e5-small", "ppocrv5-mobile"]
    with pytest.raises(SystemExit, match=r"'all-minilm-l6-v2' .* is not an OCR model"):
        wiring.ingest_models(Settings(ingest_ocr_model="all-minilm-l6-v2"))


def test_without_an_ocr_model_in_the_fleet_ingest_loads_none(tmp_path: Path) -> None:
    settings = two_models(tmp_path)
    assert wiring.ingest_models(settings) == ["first"]
    assert wiring.local_stack(settings).core.rules.ocr_model is None
