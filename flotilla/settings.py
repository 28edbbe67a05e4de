"""The one settings object, and the panels its settings are shown in.

Settings are nested by subsystem: besides its own fields, ``Settings`` holds one
section per subsystem (``gateway``, ``requests``, ``ocr``, ``jetstream``, ``ingest``, and the
security of the NATS and Kafka links, ``nats_security`` and ``kafka_security``),
each the very config object that subsystem takes, defined (with its defaults) in the
subsystem's own module. Their names stay flat: every setting, in a section or not, is
an environment variable (``FLOTILLA_<NAME>``) and a CLI flag (``--<name>``) of every
command that takes settings, named after the field or, in a section, after the field's
alias (``ocr.max_pages`` is ``--ocr-max-pages``). ``setting_fields`` lists them by
that name. Each command's ``--help`` lists the ones it reads (``flotilla.cli``
declares which), under the titles of ``GROUPS``."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.security import NatsSecurity
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.ocr.api import OcrLimits
from gateway.config import GatewayLimits
from ingest.config import IngestConfig
from ingest.kafka_security import KafkaSecurity
from lora.config import Prices, TrainConfig


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="forbid")

    host: str = Field(
        default="127.0.0.1",
        description="Interface the HTTP servers bind: the API's, and a worker's /metrics.",
    )
    port: int = Field(
        default=8080,
        ge=0,
        le=65535,
        description="Port of the HTTP API; a gateway's reply topic is named after it unless "
        "--gateway-id is set.",
    )
    fleet: Path | None = Field(
        default=None, description="Fleet YAML file; the bundled default fleet when unset."
    )
    model_cache_dir: Path | None = Field(
        default=None,
        description="Where models the fleet imports ('source: {import: ...}') are written on "
        "first load and reused while their inputs are unchanged; "
        "$XDG_CACHE_HOME/flotilla/models or ~/.cache/flotilla/models when unset. "
        "multilingual-e5-small takes 490 MB there.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Where models run; 'auto' takes CUDA when present."
    )
    threads: int = Field(
        default=0,
        ge=0,
        description="CPU threads the models run on (inference, or `lora train`); 0 uses every "
        "core, fewer leaves cores to other processes.",
    )
    memory_budget_mb: float = Field(
        default=0.0,
        ge=0,
        description="Memory the fleet's models may hold on the device, in MB: loading an "
        "on-demand model past it first evicts the least recently used model that is idle "
        "and not pinned. 0: 90% of the CUDA card's free memory at start, or 80% of the "
        "memory available to processes on a CPU. Lower leaves room to other processes, "
        "higher keeps more models resident (fewer loads).",
    )
    idle_evict_s: float = Field(
        default=60.0,
        ge=0,
        description="A worker evicts an on-demand model that had no request in hand or "
        "waiting for this many seconds (`flotilla worker`; workers load such models when "
        "their queue has work and too few hosts). Lower frees memory for other models "
        "sooner, higher spares reloads of a model whose requests come in bursts.",
    )
    fleet_state: Path | None = Field(
        default=None,
        description="A YAML file recording the models added and removed through the admin "
        "API, applied over --fleet at start so the changes survive a restart; unset, they "
        "last until the server stops.",
    )
    tuned_file: Path | None = Field(
        default=None,
        description="Tuned profiles (`flotilla tune` writes them): a model whose fleet profile "
        "says dtype: auto runs with the one tuned for this device's fingerprint. Unset, "
        "serving reads the profiles shipped in the package and, over them (per model and "
        "fingerprint), your own file <model-cache-dir>/tuned/tuned.yaml, where `flotilla "
        "tune` writes; set, this file alone is read and written.",
    )
    untuned: Literal["defaults", "quick", "background"] = Field(
        default="background",
        description="What a dtype: auto model gets on a device with no tuned profile: "
        "'background', served at once on the fleet's profile (or one tuned on the same CPU "
        "with another core count) while a tune runs in a low-priority process, then moved to "
        "its result between batches and the result kept for the next start (in "
        "<model-cache-dir>/tuned/profiles.yaml); 'quick', the same tune before the model "
        "reports ready (seconds to minutes per model); 'defaults', the fleet's profile, "
        "never tuned.",
    )
    tune_budget_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest a background tune of one model may take; past it the best "
        "profile measured so far is used, or nothing changes. Lower settles sooner, higher "
        "tries every candidate on a slow or busy machine.",
    )
    tune_nice: int = Field(
        default=5,
        ge=0,
        le=19,
        description="The background tune's CPU priority (a nice value): on a core serving "
        "keeps busy, 5 gives the tune about a quarter of it, so it ends within its budget "
        "while serving keeps the rest; 19 leaves it only what serving leaves idle (a "
        "saturated device then never tunes).",
    )
    calibration_dir: Path | None = Field(
        default=None,
        description="`flotilla tune`: a folder of German laws (gesetze/*.md format) to "
        "calibrate multilingual models on and take their retrieval check from; unset, "
        "they calibrate on English text (--calibration gesetze needs it).",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest a connection may take to send a request's headers; past it the "
        "connection is dropped. Lower frees stalled connections sooner, higher tolerates "
        "slower links.",
    )
    # Shared by the gateway's admission, ingest's jobs and the documents client.
    bytes_per_token: float = Field(
        default=4.0,
        gt=0,
        description="Body bytes per token when a job's size is estimated without parsing it, "
        "for admission (--max-inflight-tokens) and batching. Lower overestimates: fewer "
        "requests admitted at once, smaller batches.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="Least severe log messages written: debug, info, warning or error.",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        description="OpenTelemetry collector (Jaeger, Tempo, an OTel Collector) to export "
        "request traces to over OTLP/HTTP, e.g. http://collector:4318 (spans go to "
        "<url>/v1/traces). Unset: no trace is recorded and tracing costs nothing; set, "
        "each request costs a few spans (needs the 'tracing' extra).",
    )

    # -- the vector store and the files ------------------------------------
    store: Literal["edge", "qdrant"] = Field(
        default="edge",
        description="'edge': Qdrant's engine in-process, on disk under --data-dir (one process "
        "owns it). 'qdrant': a Qdrant server at --qdrant-url.",
    )
    data_dir: Path = Field(
        default=Path("flotilla-data"),
        description="Where flotilla keeps its files: the embedded store's (--store edge) and, "
        "unless --adapters-dir says otherwise, the registered adapters (<data-dir>/adapters).",
    )
    adapters_dir: Path | None = Field(
        default=None,
        description="Where `flotilla lora add` registers LoRA adapters (<dir>/<model>/<name>/) "
        "and servers find them on first use; default <data-dir>/adapters.",
    )
    qdrant_url: str | None = Field(
        default=None,
        description="Qdrant server URL (--store qdrant); https://... speaks TLS, verifying the "
        "server against --qdrant-ca-file or, without one, the system's trust store.",
    )
    # A SecretStr: the key shows as '**********' wherever the settings are printed or logged.
    qdrant_api_key: SecretStr | None = Field(
        default=None, description="Qdrant API key, if any; send it over https:// only."
    )
    qdrant_ca_file: Path | None = Field(
        default=None,
        description="PEM file of the CA(s) the Qdrant server's certificate must chain to (a "
        "private CA); replaces the system's trust store for that server.",
    )
    qdrant_client_cert: Path | None = Field(
        default=None,
        description="PEM client certificate shown to a Qdrant server that requires one "
        "(mutual TLS); its key too unless --qdrant-client-key is given.",
    )
    qdrant_client_key: Path | None = Field(
        default=None, description="PEM private key of --qdrant-client-cert, if in its own file."
    )
    progress_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between the plain progress lines a long command prints when its "
        "output is not a terminal (a log, CI, a pipe); a terminal gets a live bar instead.",
    )

    # -- the distributed work queue (`flotilla gateway` / `flotilla worker`) ----
    worker_port: int = Field(
        default=9400,
        ge=0,
        le=65535,
        description="`flotilla worker`: port of its /metrics (Prometheus), /health and /ready; "
        "0 turns it off.",
    )
    reply_topic_prefix: str = Field(
        default="flotilla.replies",
        description="Each gateway reads its results from the NATS subject <prefix>.<gateway-id>.",
    )
    gateway_id: str | None = Field(
        default=None,
        description="Names this gateway's reply subject; <hostname>-<port> when unset. Keep it "
        "unique per gateway: gateways sharing one each receive, and drop, the other's replies.",
    )
    # Which substrate carries requests (flotilla.transports); its settings are `jetstream`.
    nats: str | None = Field(
        default=None,
        description="NATS server URL(s) with JetStream (nats://host:4222,...): `gateway` and "
        "`worker` share their work queue through it, per message (any worker takes any "
        "request of a model it hosts).",
    )

    # -- the subsystems' own settings: each section is the object its subsystem takes,
    # defaults included; each of its fields is a setting, named by its alias if it has
    # one. The wiring hands a section over as it is.
    gateway: GatewayLimits = Field(default_factory=GatewayLimits)
    requests: RequestLimits = Field(default_factory=RequestLimits)
    ocr: OcrLimits = Field(default_factory=OcrLimits)
    jetstream: JetStreamConfig = Field(default_factory=JetStreamConfig)
    nats_security: NatsSecurity = Field(default_factory=NatsSecurity)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    kafka_security: KafkaSecurity = Field(default_factory=KafkaSecurity)

    @property
    def adapters_root(self) -> Path:
        return self.adapters_dir or self.data_dir / "adapters"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sections = SectionVariables(settings_cls)
        return init_settings, env_settings, sections, dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _into_sections(cls, data: Any) -> Any:
        """A section's setting given by its name (a flag, a keyword argument) goes into its
        section, over what the environment gave that section."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, where in setting_fields(cls).items():
            if where.section is None or name not in data:
                continue
            section = data.get(where.section) or {}
            if isinstance(section, BaseModel):
                section = section.model_dump(exclude_unset=True)
            data[where.section] = {**section, where.field: data.pop(name)}
        return data

    def updated(self, **changes: Any) -> Self:
        """A copy with ``changes``, each given by its setting's name (as its flag)."""
        fields = setting_fields(type(self))
        own: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            where = fields[name]
            if where.section is None:
                own[where.field] = value
            else:
                sections.setdefault(where.section, {})[where.field] = value
        for section, values in sections.items():
            own[section] = getattr(self, section).model_copy(update=values)
        return self.model_copy(update=own)


@dataclass(frozen=True, slots=True)
class Setting:
    """Where one setting lives: ``field`` of ``Settings`` itself (``section`` None), or of
    the section ``section``; ``info`` holds its default, type and description."""

    section: str | None
    field: str
    info: FieldInfo

    def value(self, settings: BaseModel) -> Any:
        holder = settings if self.section is None else getattr(settings, self.section)
        return getattr(holder, self.field)

    def is_set(self, settings: BaseModel) -> bool:
        """Given (by a flag, a variable or a keyword), not left at its default."""
        holder = settings if self.section is None else getattr(settings, self.section)
        return self.field in holder.model_fields_set


def _section(info: FieldInfo) -> type[BaseModel] | None:
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


@functools.cache
def setting_fields(cls: type[BaseModel]) -> dict[str, Setting]:
    """Every setting of ``cls`` by its name: its flag is --<name> (underscores as dashes),
    its variable FLOTILLA_<NAME>. A section's field is named by its alias, else by its
    own name."""
    found: dict[str, Setting] = {}
    for name, info in cls.model_fields.items():
        section = _section(info)
        inside = section.model_fields.items() if section else [(name, info)]
        for field, sub in inside:
            alias = sub.validation_alias if section else None
            key = alias if isinstance(alias, str) else field
            if key in found or (section and key in cls.model_fields):
                raise TypeError(f"{cls.__name__}: {key!r} names two settings, or a section")
            found[key] = Setting(name if section else None, field, sub)
    return found


def section_settings(section: str, cls: type[BaseModel] = Settings) -> tuple[str, ...]:
    """The names of a section's settings, in the order of its fields."""
    return tuple(n for n, where in setting_fields(cls).items() if where.section == section)


def setting_values(settings: Settings, *, given: bool = False) -> dict[str, Any]:
    """The settings' values by their names; ``given``: only those not left at their
    defaults."""
    return {
        name: where.value(settings)
        for name, where in setting_fields(type(settings)).items()
        if not given or where.is_set(settings)
    }


class SectionVariables(PydanticBaseSettingsSource):
    """FLOTILLA_<NAME> of each setting inside a section, into its section: pydantic-
    settings itself reads a variable per field of Settings only (FLOTILLA_OCR, not
    FLOTILLA_OCR_MAX_PAGES). Below the other variables and the keywords (flags)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        prefix = self.config.get("env_prefix", "").lower()
        environ = {key.lower(): value for key, value in os.environ.items()}
        values: dict[str, dict[str, Any]] = {}
        for name, where in setting_fields(self.settings_cls).items():
            value = environ.get(f"{prefix}{name}")
            if where.section is not None and value is not None:
                values.setdefault(where.section, {})[where.field] = value
        return values


class LoraSettings(Settings, TrainConfig, Prices):
    """The settings of `flotilla lora train`: the fleet and device ones, the LoRA and
    training knobs (``lora.config.TrainConfig``) and the prices a run's cost is counted
    in (``lora.config.Prices``)."""

    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="forbid")


# The panels of `--help`, in this order: every setting is in exactly one, so that a
# setting is found under the same title in every command that reads it. Which settings a
# command reads is declared by the command (flotilla.cli); it shows only those. A panel
# holding a boolean flag (two columns of names) keeps to short names, or Rich cuts them
# at 80 columns.
GROUPS: dict[str, tuple[str, ...]] = {
    "Server": ("host", "port", "worker_port", "log_level", "otlp_endpoint"),
    # auto_truncate is how the models take over-long inputs, from requests or ingest alike.
    "Models": (
        "fleet",
        "device",
        "threads",
        "auto_truncate",
        "memory_budget_mb",
        "idle_evict_s",
        "fleet_state",
    ),
    "Tuning": ("tuned_file", "untuned", "tune_budget_s", "tune_nice", "calibration_dir"),
    "Directories": ("model_cache_dir", "data_dir", "adapters_dir"),
    "Requests": (
        "api_keys",
        "admin_keys",
        "request_timeout_s",
        "max_body_bytes",
        "header_timeout_s",
        "body_timeout_s",
        "max_inputs_per_request",
        "max_inflight_tokens",
        "bytes_per_token",
    ),
    "OCR": section_settings("ocr"),
    "Vector store": (
        "store",
        "qdrant_url",
        "qdrant_api_key",
        "qdrant_ca_file",
        "qdrant_client_cert",
        "qdrant_client_key",
    ),
    "Ingest": (
        "collection",
        "ingest_model",
        "ingest_ocr_model",
        "chunking",
        "chunk_max_tokens",
        "chunk_overlap_tokens",
        "ingest_max_text_bytes",
        "ingest_max_records",
        "progress_interval_s",
    ),
    "Kafka": ("kafka", "topic", "group", "dlq_create"),
    "Kafka security": section_settings("kafka_security"),
    "JetStream": ("nats", *section_settings("jetstream"), "reply_topic_prefix", "gateway_id"),
    "NATS security": section_settings("nats_security"),
    "LoRA training": tuple(TrainConfig.model_fields),
    "Prices": tuple(Prices.model_fields),
}
