"""Settings nested by subsystem: each section is the config object its subsystem takes,
its settings keep their flat names (FLOTILLA_<NAME>, --<name>), the wiring hands the
sections over as they are, and every default is written once: where a subsystem still
takes a setting as a keyword with a default of its own, the two are checked equal."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import flotilla.serve
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.fleet import load_fleet
from embedder.tasks.ocr.api import OcrLimits
from flotilla import wiring
from flotilla.cli import app
from flotilla.settings import (
    LoraSettings,
    Settings,
    section_settings,
    setting_fields,
    setting_values,
)
from flotilla.transports import JetStreamTransport
from gateway.config import GatewayConfig, GatewayLimits
from ingest.chunking import Chunking
from ingest.config import IngestConfig
from ingest.embedding import QueueEmbedder
from ingest.kafka_source import KafkaSource
from ingest.reading import QueueReader

pytestmark = pytest.mark.usefixtures("clean_env")

SECTIONS = {
    "gateway": GatewayLimits,
    "requests": RequestLimits,
    "ocr": OcrLimits,
    "jetstream": JetStreamConfig,
    "ingest": IngestConfig,
}


def test_each_section_is_the_config_its_subsystem_takes() -> None:
    settings = Settings()
    for name, cls in SECTIONS.items():
        assert Settings.model_fields[name].annotation is cls, name
        assert type(getattr(settings, name)) is cls
        assert getattr(settings, name) == cls()  # its defaults are the section's own
    sections = {n for n, i in Settings.model_fields.items() if isinstance(i.annotation, type)}
    assert {n for n in sections if n in SECTIONS} == set(SECTIONS)


def test_section_settings_keep_their_flat_names() -> None:
    fields = setting_fields(Settings)
    assert fields["max_inputs_per_request"].section == "requests"
    assert fields["max_inputs_per_request"].field == "max_inputs"
    assert fields["kafka"].section == "ingest" and fields["kafka"].field == "bootstrap"
    assert section_settings("ocr") == (
        "ocr_max_document_bytes",
        "ocr_max_pages",
        "ocr_max_pixels",
        "ocr_pdf_dpi",
        "ocr_local_roots",
    )
    assert all(name.startswith("nats_") for name in section_settings("jetstream"))
    assert not set(SECTIONS) & set(fields)  # a section is no setting of its own
    assert set(setting_fields(Settings)) <= set(setting_fields(LoraSettings))


def test_a_flat_variable_reaches_its_section(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "FLOTILLA_NATS_STREAM": "ENV_JOBS",
        "FLOTILLA_NATS_STORAGE": "memory",
        "FLOTILLA_OCR_MAX_PAGES": "5",
        "FLOTILLA_OCR_LOCAL_ROOTS": "/a, /b",
        "FLOTILLA_MAX_INPUTS_PER_REQUEST": "9",
        "FLOTILLA_API_KEYS": "k1,k2",
        "FLOTILLA_KAFKA": "kafka:9092",
        "FLOTILLA_CHUNKING": "false",
        "flotilla_ingest_max_records": "7",  # as pydantic-settings: any case
    }.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert (settings.jetstream.stream, settings.jetstream.storage) == ("ENV_JOBS", "memory")
    assert settings.ocr.max_pages == 5
    assert settings.ocr.local_roots == (Path("/a"), Path("/b"))
    assert settings.requests.max_inputs == 9
    assert settings.gateway.api_keys == ("k1", "k2")
    assert settings.ingest.bootstrap == "kafka:9092"
    assert settings.ingest.chunking is False
    assert settings.ingest.max_records == 7


def test_a_keyword_goes_into_its_section_over_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLOTILLA_OCR_MAX_PAGES", "5")
    monkeypatch.setenv("FLOTILLA_OCR_PDF_DPI", "100")
    settings = Settings(ocr_max_pages=7, nats_max_deliver=2)
    assert (settings.ocr.max_pages, settings.ocr.pdf_dpi) == (7, 100.0)  # the rest kept
    assert settings.jetstream.max_deliver == 2
    whole = Settings(ocr=OcrLimits(max_pixels=10), ocr_max_pages=3)
    assert (whole.ocr.max_pixels, whole.ocr.max_pages) == (10, 3)


def test_a_bad_value_in_a_section_names_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"ocr\.max_pages"):
        Settings(ocr_max_pages=0)
    monkeypatch.setenv("FLOTILLA_NATS_STORAGE", "tape")
    with pytest.raises(ValueError, match="storage"):
        Settings()


def test_a_flag_reaches_its_section(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    served: list[Settings] = []
    monkeypatch.setattr(flotilla.serve, "serve", served.append)
    env = {"FLOTILLA_NATS_STREAM": "ENV_JOBS", "FLOTILLA_OCR_MAX_PAGES": "5"}
    args = ["serve", "--ocr-max-pages", "3", "--kafka", "k:9092", "--no-chunking"]
    args += ["--max-inputs-per-request", "4", "--api-keys", "a,b", "--ocr-local-roots", "/x"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    (settings,) = served
    assert settings.ocr.max_pages == 3  # the flag over the variable
    assert settings.ocr.local_roots == (Path("/x"),)
    assert settings.jetstream.stream == "ENV_JOBS"  # a hidden setting, from the variable
    assert settings.ingest.bootstrap == "k:9092" and settings.ingest.chunking is False
    assert settings.requests.max_inputs == 4
    assert settings.gateway.api_keys == ("a", "b")


def test_a_bad_flag_in_a_section_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flotilla.serve, "serve", lambda settings: None)
    result = CliRunner().invoke(app, ["serve", "--ocr-max-pages", "0"])
    assert result.exit_code == 2, result.output
    # named as the user gave it, not by its place in the sections (ocr.max_pages)
    assert "--ocr-max-pages / FLOTILLA_OCR_MAX_PAGES: Input should be greater than 0" in (
        result.output
    )


def test_updated_changes_settings_by_their_names() -> None:
    settings = Settings(port=9000, ocr_max_pages=3)
    changed = settings.updated(auto_truncate=True, chunking=False, data_dir=Path("d"))
    assert changed.requests.auto_truncate is True and changed.ingest.chunking is False
    assert changed.data_dir == Path("d")
    assert (changed.port, changed.ocr.max_pages) == (9000, 3)  # the rest kept
    assert settings.requests.auto_truncate is False  # the original untouched
    given = setting_values(changed, given=True)
    assert given == {
        "port": 9000,
        "ocr_max_pages": 3,
        "auto_truncate": True,
        "chunking": False,
        "data_dir": Path("d"),
    }


# -- the wiring hands the sections over -----------------------------------------------


def test_the_wiring_passes_the_sections_themselves() -> None:
    settings = Settings(ocr_max_pages=3, max_inputs_per_request=9, nats="nats://n:4222")
    config = wiring.gateway_config(settings)
    assert config.limits is settings.gateway and config.ocr is settings.ocr
    assert config.max_documents_per_request == settings.ingest.max_records
    fleet = load_fleet()
    catalog = wiring.adapter_catalog(settings, fleet)
    host = wiring.model_host(settings, fleet, InProcessQueue(), catalog)
    assert host.options[type(settings.requests)] is settings.requests
    assert host.options[type(settings.ocr)] is settings.ocr
    transport = JetStreamTransport()
    assert transport.puller(settings, "w").config is settings.jetstream  # type: ignore[attr-defined]
    assert transport.submitter(settings).config is settings.jetstream  # type: ignore[attr-defined]


# -- one default per setting ----------------------------------------------------------

# The subsystems that still take a setting as a keyword with a default of their own
# (tests and benchmarks build them without the settings): callable, keyword, setting.
KEYWORD_DEFAULTS: list[tuple[Callable[..., Any], str, str]] = [
    (ModelHost, "device", "device"),
    (ModelHost, "threads", "threads"),
    (ModelHost, "untuned", "untuned"),
    (QueueEmbedder, "bytes_per_token", "bytes_per_token"),
    (QueueEmbedder, "truncate", "auto_truncate"),
    (QueueReader, "bytes_per_token", "bytes_per_token"),
    (QueueReader, "max_pages", "ocr_max_pages"),
    (Chunking, "enabled", "chunking"),
    (Chunking, "max_tokens", "chunk_max_tokens"),
    (Chunking, "overlap_tokens", "chunk_overlap_tokens"),
    (KafkaSource, "max_records", "ingest_max_records"),
    (KafkaSource, "dlq_create", "dlq_create"),
]


@pytest.mark.parametrize(
    ("target", "keyword", "setting"),
    KEYWORD_DEFAULTS,
    ids=[f"{t.__name__}.{k}" for t, k, _ in KEYWORD_DEFAULTS],
)
def test_a_keyword_default_is_its_settings_default(
    target: Callable[..., Any], keyword: str, setting: str
) -> None:
    default = inspect.signature(target).parameters[keyword].default
    assert default == setting_values(Settings())[setting]


def test_the_gateway_config_takes_the_sections_defaults() -> None:
    config = GatewayConfig(version="v", bytes_per_token=4.0, max_documents_per_request=1)
    assert config.limits == Settings().gateway and config.ocr == Settings().ocr


def test_no_default_points_outside_the_working_directory() -> None:
    """A path setting is unset (the package's own, or nothing) or under the directory the
    command runs in, never beside an install."""
    for name, where in setting_fields(LoraSettings).items():
        annotation = where.info.annotation
        if Path not in (annotation, *typing.get_args(annotation)):
            continue
        default = where.info.get_default(call_default_factory=True)
        if default is None or default == ():
            continue
        for path in default if isinstance(default, tuple | list) else [default]:
            assert not Path(path).is_absolute() and ".." not in Path(path).parts, name


# -- secrets --------------------------------------------------------------------------


def test_secrets_come_from_flags_and_variables_and_show_as_asterisks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLOTILLA_NATS_PASSWORD", "nats-Pa55")
    monkeypatch.setenv("FLOTILLA_KAFKA_SASL_PASSWORD", "kafka-Pa55")
    settings = Settings(nats_user="u", kafka_security_protocol="SASL_SSL", kafka_sasl_username="k")
    assert settings.nats_security.password is not None
    assert settings.nats_security.password.get_secret_value() == "nats-Pa55"
    assert settings.kafka_security.sasl_password is not None
    assert settings.kafka_security.sasl_password.get_secret_value() == "kafka-Pa55"
    shown = f"{settings!r} {settings.model_dump()} {setting_values(settings)}"
    assert "Pa55" not in shown


def test_a_refused_setting_never_echoes_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flotilla.serve, "serve", lambda settings: None)
    env = {"FLOTILLA_KAFKA_SASL_PASSWORD": "kafka-Pa55"}
    result = CliRunner().invoke(app, ["serve", "--kafka-sasl-username", "k"], env=env)
    assert result.exit_code == 2, result.output
    assert "SASL user and password need" in result.output  # the check, by its settings
    assert "--kafka-security-protocol" in result.output
    assert "Pa55" not in result.output
