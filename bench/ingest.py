"""End-to-end Kafka ingest against the embed-only ceiling of the same worker.

Side by side in one process, on the same texts (bench.texts, mixed lengths):

- ceiling: every document embedded through the worker exactly as ingest does it
  (one RAW_VECTORS job per document through the in-process queue), nothing else;
- ingest: the documents on a real 4-partition Kafka topic (a local Apache Kafka
  started for the run), consumed by KafkaSource -> IngestCore -> the embedded
  store (qdrant-edge), timed from start until every record is committed.

Reports docs/s and tokens/s of both and the ratio ingest/ceiling (target >= 0.9),
alternating the two a few times and taking medians.

    python -m bench.ingest [--n-docs 2000] [--reps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench import texts
from bench.report import machine, median, results_dir, table, write_json
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.fleet import load_fleet
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from ingest.embedding import QueueEmbedder
from ingest.kafka_source import KafkaSource
from ingest.pipeline import IngestCore
from ingest.records import RecordRules
from ingest.store.edge import EdgeStore
from tests.kafka.broker import KafkaBroker

MODEL = "all-minilm-l6-v2"


async def _topic(bootstrap: str, name: str, partitions: int, docs: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
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


async def _committed(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
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
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", threads=args.threads)
    rules = RecordRules("bench", MODEL, 1_000_000, lambda n: n if n in fleet.models else None)
    ceiling_s: list[float] = []
    ingest_s: list[float] = []
    with KafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        async with host:
            await host.wait_ready()
            runtime = host.loaded[MODEL].runtime
            tokens = runtime.tokenize(docs, "right").tokens
            embedder = QueueEmbedder(queue)
            await embedder.embed([(MODEL, t) for t in docs[:64]])  # warm up
            for rep in range(args.reps):
                start = time.perf_counter()
                results = await embedder.embed([(MODEL, t) for t in docs])
                ceiling_s.append(time.perf_counter() - start)
                failed = [r for r in results if isinstance(r, Exception)]
                assert not failed, failed[:3]

                topic, group = f"bench-{rep}", f"bench-{rep}"
                await _topic(broker.bootstrap, topic, args.partitions, docs)
                async with EdgeStore(Path(tmp) / f"store-{rep}") as store:
                    source = KafkaSource(
                        IngestCore(embedder, store, rules),
                        bootstrap=broker.bootstrap,
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
                committed = await _committed(broker.bootstrap, topic, group, args.partitions)
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(run(args))
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
