"""The one settings object, and the panels its fields are shown in.

Every field is an environment variable (``FLOTILLA_<NAME>``) and a CLI flag
(``--<name>``) of every command that takes settings; each command's ``--help`` lists the
ones it reads (``flotilla.cli`` declares which), under the titles of ``GROUPS``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

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
    tuned_file: Path | None = Field(
        default=None,
        description="Tuned profiles (`flotilla tune` writes them): a model whose fleet profile "
        "says dtype: auto runs with the one tuned for this device's fingerprint. The file "
        "shipped in the package when unset.",
    )
    untuned: Literal["defaults", "quick"] = Field(
        default="defaults",
        description="What a dtype: auto model gets on a device with no tuned profile: "
        "'defaults', the fleet's profile (fp32 or bf16 autocast, timed at load); 'quick', a "
        "short tune at load (runtime x precision on English text, seconds per model).",
    )
    calibration_dir: Path = Field(
        default=Path("../shared/data/gesetze"),
        description="`flotilla tune`: German laws (gesetze/*.md) to calibrate multilingual "
        "models on and take their retrieval check from; English text when absent.",
    )
    request_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Deadline of a request from arrival; past it the client gets 504 and the "
        "worker skips the job.",
    )
    max_body_bytes: int = Field(
        default=4_000_000, gt=0, description="Largest request body accepted (413 above)."
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest a connection may take to send a request's headers; past it the "
        "connection is dropped. Lower frees stalled connections sooner, higher tolerates "
        "slower links.",
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest wait for the next piece of a request body; past it the client "
        "gets 408 and the connection closes. Lower frees stalled connections sooner, higher "
        "tolerates slower uploads.",
    )
    max_inputs_per_request: int = Field(
        default=512,
        gt=0,
        description="Most inputs or documents in one request (413 above); checked where the "
        "models run (`serve`, `worker`).",
    )
    auto_truncate: bool = Field(
        default=False,
        description="Cut over-long inputs to the model's limit instead of refusing them: "
        "requests that do not say (OpenAI and Cohere shapes) get vectors instead of a 413, "
        "ingested documents are cut instead of dead-lettered. Applied where the models run.",
    )
    max_inflight_tokens: int = Field(
        default=65_536,
        gt=0,
        description="Estimated tokens admitted per model at once; beyond it requests get 429 "
        "with Retry-After. Higher absorbs bursts, lower bounds queueing latency.",
    )
    bytes_per_token: float = Field(
        default=4.0,
        gt=0,
        description="Body bytes per token when a job's size is estimated without parsing it, "
        "for admission (--max-inflight-tokens) and batching. Lower overestimates: fewer "
        "requests admitted at once, smaller batches.",
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Accepted bearer tokens, comma-separated; empty leaves the API open.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="Least severe log messages written: debug, info, warning or error.",
    )

    # -- OCR (/v1/ocr) ------------------------------------------------------
    ocr_max_document_bytes: int = Field(
        default=20_000_000,
        gt=0,
        description="Largest document (image or PDF) one OCR request may carry, decoded, "
        "or a local file may have (413 above). Also bounded by --max-body-bytes for "
        "documents sent in the body (base64 takes 4/3 of the bytes).",
    )
    ocr_max_pages: int = Field(
        default=64,
        gt=0,
        description="Most pages one OCR request may read (413 above): one request holds "
        "the OCR worker for all its pages, so lower keeps other requests' latency down.",
    )
    ocr_max_pixels: int = Field(
        default=40_000_000,
        gt=0,
        description="Most pixels of one page image, read from its header before it is "
        "decoded (413 above); a PDF page is rendered at a lower resolution to fit. Each "
        "million pixels costs 3 MB of memory while the page is read.",
    )
    ocr_pdf_dpi: float = Field(
        default=200.0,
        gt=0,
        le=1200,
        description="Resolution PDF pages without a text layer are rendered at for OCR: "
        "higher reads smaller print, and costs memory and time with its square.",
    )
    ocr_local_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Folders an OCR request's file URL or path may point into, "
        "comma-separated, checked after symlinks resolve; empty: documents only in the "
        "request body. Read by the worker, on its machine.",
    )

    # -- ingestion and the vector store ------------------------------------
    kafka: str | None = Field(
        default=None,
        description="Kafka bootstrap servers (host:port,...) of the documents to ingest: with "
        "--topic, `serve` also ingests. Requests travel on JetStream (--nats), not Kafka.",
    )
    topic: str | None = Field(default=None, description="Kafka topic of documents to ingest.")
    group: str = Field(
        default="flotilla-ingest",
        description="Consumer group; ingest workers in one group share the topic's partitions.",
    )
    collection: str = Field(
        default="documents",
        description="Collection for records that do not name one; `eval retrieval` writes "
        "<collection>.<model>.",
    )
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
    qdrant_url: str | None = Field(default=None, description="Qdrant server URL (--store qdrant).")
    qdrant_api_key: str | None = Field(default=None, description="Qdrant API key, if any.")
    ingest_model: str | None = Field(
        default=None,
        description="Model that embeds the documents of `ingest` and `serve --kafka` (name, "
        "alias or MODEL:ADAPTER); the fleet's first when unset. A record's flotilla-model "
        "header or 'model' field still chooses its own.",
    )
    ingest_ocr_model: str | None = Field(
        default=None,
        description="OCR model that reads the records carrying an image or PDF instead of "
        "text (`ingest`, `serve --kafka`, the documents route); the fleet's first OCR model "
        "when unset. `ingest` loads it beside its embedding model; without one such records "
        "are dead-lettered.",
    )
    chunking: bool = Field(
        default=True,
        description="Split a document longer than its model's window into passages, each a "
        "point of its own, at sentence or paragraph ends. Off: such a document is "
        "dead-lettered, or cut to the window with --auto-truncate.",
    )
    chunk_max_tokens: int = Field(
        default=0,
        ge=0,
        description="Most tokens in a passage, the model's prompt and special tokens "
        "included; 0 (or more than the window) takes the model's window. Smaller passages "
        "match more precisely and make more points to embed and store.",
    )
    chunk_overlap_tokens: int = Field(
        default=0,
        ge=0,
        description="Tokens at the end of a passage repeated at the start of the next, in "
        "whole units (sentences, else words), at most half a passage. More keeps context "
        "across a cut; each repeated token is embedded and stored again.",
    )
    ingest_max_text_bytes: int = Field(
        default=200_000,
        gt=0,
        description="Longest document text accepted, in UTF-8 bytes; longer documents are "
        "dead-lettered, not embedded.",
    )
    ingest_max_records: int = Field(
        default=512,
        gt=0,
        description="Records per chunk: one commit per chunk. Larger amortizes commits and "
        "fills batches; smaller redelivers less after a crash. Also the most documents "
        "one request to a server's documents route may carry (413 above).",
    )
    progress_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between the plain progress lines a long command prints when its "
        "output is not a terminal (a log, CI, a pipe); a terminal gets a live bar instead.",
    )
    dlq_create: bool = Field(
        default=True,
        description="Create the dead-letter topic <topic>.dlq at start when it is missing "
        "(with the topic's partition count). Off: a missing one stops ingest at start, for "
        "clusters where only their owners create topics.",
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

    # -- the JetStream work queue (`flotilla gateway --nats` / `flotilla worker --nats`) --
    nats: str | None = Field(
        default=None,
        description="NATS server URL(s) with JetStream (nats://host:4222,...): `gateway` and "
        "`worker` share their work queue through it, per message (any worker takes any "
        "request of a model it hosts).",
    )
    nats_stream: str = Field(
        default="FLOTILLA_JOBS",
        description="Work-queue stream of requests; its dead letters go to <stream>_DEAD and "
        "worker liveness to the KV bucket <stream>_workers.",
    )
    nats_subject_prefix: str = Field(
        default="flotilla.jobs",
        description="Requests are published on <prefix>.<model>: a worker pulls only the "
        "models it hosts, through one durable consumer per model its peers share.",
    )
    nats_storage: Literal["memory", "file"] = Field(
        default="file",
        description="Where the stream keeps requests: 'file' survives a server restart and "
        "costs a disk write per request; 'memory' is faster and loses the queued requests "
        "when the server restarts (their clients get 504).",
    )
    nats_ack_wait_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a request a worker holds without news goes unacked before it "
        "is given to another worker. Lower recovers a dead worker's requests sooner; workers "
        "send in-progress acks every third of it, so long jobs are not run twice.",
    )
    nats_max_ack_pending: int = Field(
        default=1_024,
        gt=0,
        description="Most requests of one model held by all its workers at once (fetched, not "
        "yet acked); past it the server hands out nothing more. Higher fills more workers' "
        "budgets; lower bounds what a dead worker strands until --nats-ack-wait-s.",
    )
    nats_max_deliver: int = Field(
        default=5,
        gt=0,
        description="Deliveries of one request before it is dead-lettered (<stream>_DEAD, with "
        "the reason) and its client gets 502. Counts crashes, stalls past the ack wait and "
        "hand-backs over a worker's budget: higher tolerates more, lower stops a request "
        "that kills workers sooner.",
    )
    nats_nak_delay_ms: int = Field(
        default=20,
        ge=0,
        description="Delay before a request a worker handed back (over its token budget) is "
        "offered again. Lower gives it sooner to a free worker; higher keeps the same busy "
        "worker from taking it straight back.",
    )
    nats_max_age_s: float = Field(
        default=3_600.0,
        gt=0,
        description="Longest a request or dead letter is kept in its stream; requests expire "
        "at their own deadline long before, so this only bounds what an outage leaves.",
    )
    nats_max_bytes: int = Field(
        default=1 << 30,
        gt=0,
        description="Bytes the request stream (and the dead-letter stream) may hold; past it "
        "new requests are refused (503) instead of old ones being dropped unseen.",
    )
    nats_max_message_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Largest request flotilla publishes (413 above), also the streams' message "
        "limit; the server's max_payload (1 MB unless configured) caps requests and replies.",
    )
    nats_replicas: int = Field(
        default=1,
        ge=1,
        description="Copies of each stream in a NATS cluster (at most 5): 3 survives a "
        "server loss, at the cost of a replicated write per request; 1 on a single server.",
    )

    @property
    def adapters_root(self) -> Path:
        return self.adapters_dir or self.data_dir / "adapters"

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @field_validator("ocr_local_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str | Path):  # the variable, or the flag (parsed as a path)
            return [Path(root.strip()) for root in str(value).split(",") if root.strip()]
        return value


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
    "Server": ("host", "port", "worker_port", "log_level"),
    # auto_truncate is how the models take over-long inputs, from requests or ingest alike.
    "Models": ("fleet", "device", "threads", "auto_truncate"),
    "Tuning": ("tuned_file", "untuned", "calibration_dir"),
    "Directories": ("model_cache_dir", "data_dir", "adapters_dir"),
    "Requests": (
        "api_keys",
        "request_timeout_s",
        "max_body_bytes",
        "header_timeout_s",
        "body_timeout_s",
        "max_inputs_per_request",
        "max_inflight_tokens",
        "bytes_per_token",
    ),
    "OCR": (
        "ocr_max_document_bytes",
        "ocr_max_pages",
        "ocr_max_pixels",
        "ocr_pdf_dpi",
        "ocr_local_roots",
    ),
    "Vector store": ("store", "qdrant_url", "qdrant_api_key"),
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
    "JetStream": (
        "nats",
        "nats_stream",
        "nats_subject_prefix",
        "nats_storage",
        "nats_ack_wait_s",
        "nats_max_ack_pending",
        "nats_max_deliver",
        "nats_nak_delay_ms",
        "nats_max_age_s",
        "nats_max_bytes",
        "nats_max_message_bytes",
        "nats_replicas",
        "reply_topic_prefix",
        "gateway_id",
    ),
    "LoRA training": tuple(TrainConfig.model_fields),
    "Prices": tuple(Prices.model_fields),
}
