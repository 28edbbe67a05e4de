"""The ``flotilla`` command. Every Settings field is also a flag of the commands that
take settings; flags override environment variables, which override defaults."""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from embedder.fleet import FleetError
from flotilla.settings import Settings
from flotilla.signals import exit_cleanly_until_running

app = typer.Typer(help="Serve fleets of small models.", no_args_is_help=True, add_completion=False)


def _flag_type(annotation: Any) -> Any:
    """The type Typer parses a flag as; pydantic validates the value afterwards."""
    origin = typing.get_origin(annotation)
    if annotation in (int, float, bool, str):
        return annotation
    if annotation is Path or Path in typing.get_args(annotation):
        return Path
    if origin is list:
        return str  # comma-separated, like the environment variable
    return str  # Literal and friends


def with_settings(func: Callable[..., None]) -> Callable[..., None]:
    """Give ``func(settings, ...)`` one flag per Settings field."""
    hints = typing.get_type_hints(func, include_extras=True)  # Annotated flags survive
    own = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in inspect.signature(func).parameters.values()
        if p.name != "settings"
    ]
    setting_params = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, help=field.description, show_default=False),
            annotation=_flag_type(field.annotation) | None,
        )
        for name, field in Settings.model_fields.items()
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> None:
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in Settings.model_fields}
        try:
            settings = Settings(**{k: v for k, v in given.items() if v is not None})
        except ValidationError as exc:
            raise typer.BadParameter(str(exc)) from exc
        try:
            func(settings, **kwargs)
        except FleetError as exc:  # a missing or malformed fleet file: a usage error
            raise typer.BadParameter(exc.message, param_hint="'--fleet' / FLOTILLA_FLEET") from exc

    wrapper.__signature__ = inspect.Signature(own + setting_params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + setting_params}
    return wrapper


@app.command()
@with_settings
def serve(settings: Settings) -> None:
    """Gateway, in-process queue and a worker in one process, on the embedded defaults."""
    from flotilla.serve import serve as run

    run(settings)


@app.command()
@with_settings
def gateway(settings: Settings) -> None:
    """HTTP gateway over the Kafka work queue (--kafka): annotates requests and puts them
    on --request-topic; `flotilla worker` processes run the models. Loads no model."""
    from flotilla.distributed import serve_gateway

    if not settings.kafka:
        raise typer.BadParameter("the gateway needs Kafka", param_hint="'--kafka' / FLOTILLA_KAFKA")
    serve_gateway(settings)


@app.command()
@with_settings
def worker(settings: Settings) -> None:
    """Load the fleet on this device and pull requests from --request-topic (--kafka) as a
    member of --worker-group, until SIGTERM or Ctrl-C; then finish the jobs in hand,
    commit and leave the group."""
    if not settings.kafka:
        raise typer.BadParameter("a worker needs Kafka", param_hint="'--kafka' / FLOTILLA_KAFKA")
    exit_cleanly_until_running()
    from flotilla.distributed import serve_worker

    serve_worker(settings)


@app.command()
@with_settings
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
) -> None:
    """Embed documents into the vector store: from --topic (a consumer-group member
    until Ctrl-C), or from a file (--from), or send a file to the topic (--produce)."""
    import asyncio

    if produce and source is None:
        raise typer.BadParameter("--produce sends a file: give it with --from")
    if source is not None and not source.is_file():
        raise typer.BadParameter(f"{source} is not a file", param_hint="'--from'")
    exit_cleanly_until_running()
    from flotilla import ingest as run

    if source is None:
        asyncio.run(run.consume(settings))
    elif produce:
        asyncio.run(run.produce(settings, source))
    else:
        asyncio.run(run.backfill(settings, source))


@app.command()
@with_settings
def models(settings: Settings, as_json: bool = typer.Option(False, "--json")) -> None:
    """List the fleet: names, tasks, sources and profiles."""
    from embedder.fleet import load_fleet

    fleet = load_fleet(settings.fleet)
    rows = [spec.model_dump(mode="json") for spec in fleet.models.values()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for spec in fleet.models.values():
        source = spec.source.path or spec.source.package
        aliases = f" (aliases: {', '.join(spec.aliases)})" if spec.aliases else ""
        typer.echo(f"{spec.name}\t{spec.task}\t{source}\tmax_tokens={spec.max_tokens}{aliases}")


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
    ("ingest", "bench.ingest", "Kafka ingest against the embed-only ceiling."),
    (
        "cluster",
        "bench.cluster",
        "Push vs pull: the cluster simulation; --real: real processes, a router against Kafka.",
    ),
):
    bench_app.command(_name, help=_help, context_settings=PASS_THROUGH)(_bench(_module))


def main() -> None:
    app()
