"""End-to-end Kafka ingest against the embed-only ceiling of the same worker.

Side by side in one process, on the same texts (bench.texts, mixed lengths):

- ceiling: every document embedded through the worker exactly as ingest does it
  (one RAW_VECTORS job per document through the in-process queue), nothing else;
- ingest: the documents on a real 4-partition Kafka topic (a local Apache Kafka
  started for the run, or the one --bootstrap-servers names), consumed by KafkaSource
  -> IngestCore -> the embedded store (qdrant-edge), timed from start until every
  record is committed.

Reports docs/s and tokens/s of both and the ratio ingest/ceiling (target >= 0.9),
alternating the two a few times and taking medians.

    flotilla bench ingest [--n-docs 2000] [--reps 2] [--bootstrap-servers HOST:PORT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from bench import texts
from bench.report import machine, median, results_dir, table, write_json
from bench.services.kafka.broker import KafkaBroker
from bench.services.kafka.jars import KafkaSetupError
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.engine import LoadedEncoders
from embedder.tasks.fleet import load_fleet
from ingest.dead_letters import dlq_topic
from ingest.embedding import QueueEmbedder
from ingest.kafka_clients import KafkaClients
from ingest.kafka_source import KafkaSource
from ingest.pipeline import IngestCore
from ingest.records import RecordRules
from ingest.store.edge import EdgeStore

MODEL = "all-minilm-l6-v2"
NO_KAFKA = """bench ingest needs a Kafka broker: give a running one with --bootstrap-servers \
HOST:PORT, or let the benchmark start a local one, which needs Java 17+ and the broker's \
jars (fetched once with Maven: `python -m bench.services.kafka.jars`). Starting the local \
broker failed:
"""


@contextlib.contextmanager
def kafka(bootstrap: str | None) -> Iterator[str]:
    """The bootstrap address to ingest from: the one given, else that of a broker started
    for the run and stopped after it."""
    if bootstrap:
        yield bootstrap
        return
    with KafkaBroker() as broker:
        yield broker.bootstrap


async def _topic(bootstrap: str, name: str, partitions: int, docs: list[str]) -> None:
    kafka = KafkaClients(bootstrap)
    admin = kafka.admin()
    await kafka.start(admin.start())
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    producer = kafka.producer(enable_idempotence=True, linger_ms=5)
    await kafka.start(producer.start())
    try:
        sends = [
            await producer.send(
                name, key=f"doc-{i}".encode(), value=json.dumps({"text": t}).encode()
            )
            for i, t in enumerate(docs)
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def _drop_topic(bootstrap: str, name: str) -> None:
    # A given cluster outlives the run: leave no benchmark topics behind in it, nor the
    # dead-letter topic the source made for it.
    kafka = KafkaClients(bootstrap)
    admin = kafka.admin()
    await kafka.start(admin.start())
    try:
        await admin.delete_topics([name, dlq_topic(name)])
    finally:
        await admin.close()


async def _committed(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    kafka = KafkaClients(bootstrap)
    consumer = kafka.consumer(group_id=group)
    await kafka.start(consumer.start())
    try:
        total = 0
        for p in range(partitions):
            total += await consumer.committed(TopicPartition(topic, p)) or 0
        return total
    finally:
        await consumer.stop()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = texts.build(args.n_docs)
    # Ingest dead-letters documents over the model's 256 tokens (chunking is the
    # producer's job), so the benchmark keeps the ones that fit.
    docs = [t for t, n in zip(corpus.texts, corpus.lengths, strict=True) if n <= 256]
    bundled = load_fleet()  # only the measured model: others would only delay the start
    fleet = bundled.model_copy(update={"models": {MODEL: bundled.get(MODEL)}})
    queue = InProcessQueue()
    host = ModelHost(fleet, queue, options=[RequestLimits()], device="cpu", threads=args.threads)
    rules = RecordRules("bench", MODEL, 1_000_000, lambda n: n if n in fleet.models else None)
    ceiling_s: list[float] = []
    ingest_s: list[float] = []
    run_id = uuid.uuid4().hex[:8]  # a given cluster may hold an earlier run's topics
    with kafka(args.bootstrap_servers) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        async with host:
            await host.wait_ready()
            runtime = LoadedEncoders(host.engines)[MODEL].runtime
            tokens = runtime.tokenize(docs, "right").tokens
            embedder = QueueEmbedder(queue)
            await embedder.embed([(MODEL, t) for t in docs[:64]])  # warm up
            for rep in range(args.reps):
                start = time.perf_counter()
                results = await embedder.embed([(MODEL, t) for t in docs])
                ceiling_s.append(time.perf_counter() - start)
                failed = [r for r in results if isinstance(r, Exception)]
                assert not failed, failed[:3]

                topic = group = f"flotilla-bench-{run_id}-{rep}"
                await _topic(bootstrap, topic, args.partitions, docs)
                async with EdgeStore(Path(tmp) / f"store-{rep}") as store:
                    source = KafkaSource(
                        IngestCore(embedder, store, rules),
                        bootstrap=bootstrap,
                        topic=topic,
                        group=group,
                        max_records=args.max_records,
                    )
                    start = time.perf_counter()
                    await source.start()
                    while source.totals.upserted < len(docs):  # noqa: ASYNC110 - a counter
                        await asyncio.sleep(0.02)
                    ingest_s.append(time.perf_counter() - start)
                    await source.stop()
                    stored = await store.count("bench")
                committed = await _committed(bootstrap, topic, group, args.partitions)
                await _drop_topic(bootstrap, topic)
                assert stored == len(docs) and committed == len(docs), (stored, committed)
    ceiling, ingest = median(ceiling_s), median(ingest_s)
    return {
        "benchmark": "ingest",
        "model": MODEL,
        "machine": machine(args.threads),
        "args": vars(args),
        "documents": len(docs),
        "tokens": tokens,
        "ceiling": {
            "seconds": ceiling_s,
            "docs_per_s": len(docs) / ceiling,
            "tokens_per_s": tokens / ceiling,
        },
        "ingest": {
            "seconds": ingest_s,
            "docs_per_s": len(docs) / ingest,
            "tokens_per_s": tokens / ingest,
        },
        "ratio": ceiling / ingest,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = ["embed-only ceiling", "Kafka -> embed -> edge store"]
    values = [result["ceiling"]["tokens_per_s"], result["ingest"]["tokens_per_s"]]
    ax.bar(names, values, color=["grey", "tab:blue"])
    ax.set_ylabel("tokens/s")
    ax.set_title(f"ingest / ceiling = {result['ratio']:.2f} ({result['documents']} docs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n-docs", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-records", type=int, default=512)
    parser.add_argument(
        "--bootstrap-servers",
        default=None,
        metavar="HOST:PORT",
        help="a running Kafka to ingest from; else a local broker is started for the run",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        result = asyncio.run(run(args))
    except KafkaSetupError as exc:
        print(f"{NO_KAFKA}{exc}", file=sys.stderr)
        return 2
    print(
        table(
            ["path", "docs/s", "tokens/s"],
            [
                [
                    "embed-only ceiling",
                    f"{result['ceiling']['docs_per_s']:.1f}",
                    f"{result['ceiling']['tokens_per_s']:.0f}",
                ],
                [
                    "Kafka ingest",
                    f"{result['ingest']['docs_per_s']:.1f}",
                    f"{result['ingest']['tokens_per_s']:.0f}",
                ],
            ],
        )
    )
    print(f"ingest / ceiling: {result['ratio']:.3f}  (target >= 0.9)")
    print(f"wrote {write_json('ingest.json', result)}")
    plot(result, results_dir() / "ingest.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
