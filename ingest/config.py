"""Ingest's settings: where records go and which model embeds them, how documents are
cut into passages, and how the Kafka topic is read. ``flotilla.settings`` holds them
as its ``ingest`` section, each field a setting named by its alias if it has one; the
wiring hands each part to the piece that uses it (``records.RecordRules``,
``chunking.Chunking``, ``kafka_source.KafkaSource``). Light on purpose: no Kafka
client and no tokenizer load with it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class IngestConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True)

    # -- records
    collection: str = Field(
        default="documents",
        description="Collection for records that do not name one; `eval retrieval` writes "
        "<collection>.<model>.",
    )
    model: str | None = Field(
        default=None,
        validation_alias="ingest_model",
        description="Model that embeds the documents of `ingest` and `serve --kafka` (name, "
        "alias or MODEL:ADAPTER); the fleet's first when unset. A record's flotilla-model "
        "header or 'model' field still chooses its own.",
    )
    ocr_model: str | None = Field(
        default=None,
        validation_alias="ingest_ocr_model",
        description="OCR model that reads the records carrying an image or PDF instead of "
        "text (`ingest`, `serve --kafka`, the documents route); the fleet's first OCR model "
        "when unset. `ingest` loads it beside its embedding model; without one such records "
        "are dead-lettered.",
    )
    max_text_bytes: int = Field(
        default=200_000,
        gt=0,
        validation_alias="ingest_max_text_bytes",
        description="Longest document text accepted, in UTF-8 bytes; longer documents are "
        "dead-lettered, not embedded.",
    )
    max_records: int = Field(
        default=512,
        gt=0,
        validation_alias="ingest_max_records",
        description="Records per chunk: one commit per chunk. Larger amortizes commits and "
        "fills batches; smaller redelivers less after a crash. Also the most documents "
        "one request to a server's documents route may carry (413 above).",
    )

    # -- passages (chunking.Chunking)
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

    # -- the Kafka topic (kafka_source.KafkaSource)
    bootstrap: str | None = Field(
        default=None,
        validation_alias="kafka",
        description="Kafka bootstrap servers (host:port,...) of the documents to ingest: with "
        "--topic, `serve` also ingests. Requests travel on JetStream (--nats), not Kafka.",
    )
    topic: str | None = Field(default=None, description="Kafka topic of documents to ingest.")
    group: str = Field(
        default="flotilla-ingest",
        description="Consumer group; ingest workers in one group share the topic's partitions.",
    )
    dlq_create: bool = Field(
        default=True,
        description="Create the dead-letter topic <topic>.dlq at start when it is missing "
        "(with the topic's partition count). Off: a missing one stops ingest at start, for "
        "clusters where only their owners create topics.",
    )
