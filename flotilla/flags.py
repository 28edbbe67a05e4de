"""Settings as flags: each command takes the settings its code path reads as flags,
shown in the panels of ``flotilla.settings.GROUPS``; flags override environment
variables, which override defaults. Also the width help is printed at."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import typer
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo

from embedder.core.fleet import FleetError
from flotilla.settings import GROUPS, Settings, section_settings, setting_fields

# Rich sizes help and errors to the terminal, or to COLUMNS or TERMINAL_WIDTH; with none
# of them (CI logs, output of a process without a terminal) it takes 80 columns, where the
# option columns leave the descriptions a few words per line. Such logs are read wider.
WIDTH_WITHOUT_TERMINAL = 120


def _help_width() -> int | None:
    """TERMINAL_WIDTH when set; Rich's own choice (None) with COLUMNS or a terminal;
    otherwise WIDTH_WITHOUT_TERMINAL."""
    if fixed := os.environ.get("TERMINAL_WIDTH"):
        return int(fixed)
    if os.environ.get("COLUMNS"):
        return None
    for stream in (0, 1, 2):  # the streams Rich asks for a terminal size
        with contextlib.suppress(OSError):
            os.get_terminal_size(stream)
            return None
    return WIDTH_WITHOUT_TERMINAL


def set_help_width() -> None:
    """Called before any subcommand parses its arguments, so before its --help prints."""
    import typer.rich_utils

    # Typer's console reads it at every help or error. Set on every invocation, not only
    # when widening: a process that runs the app more than once (tests) must not keep a
    # width an earlier run chose.
    typer.rich_utils.MAX_WIDTH = _help_width()


# -- which settings each command reads ---------------------------------------------------
# A command's --help shows the settings its code path reads, no others. These are the
# pieces of wiring the commands share, each as the settings it reads; a change to what
# flotilla/wiring.py (or a command's own module: serve.py, distributed.py, ingest.py,
# evaluate.py, lora.py) reads belongs here too.

# wiring.configured_fleet() and wiring.model_host(): the fleet, its device and threads.
MODELS = frozenset({"fleet", "model_cache_dir", "device", "threads"})
# wiring.model_host(): the profile each model gets (tuned, or what an untuned device gets).
PROFILES = frozenset({"tuned_file", "untuned", "tune_budget_s", "tune_nice"})
# wiring.model_host() and the admin API of `flotilla serve`: the memory the models may hold,
# who may add and remove models, and the file that keeps those changes.
RESIDENCY = frozenset({"memory_budget_mb", "fleet_state", "admin_keys"})
# flotilla.distributed.run_worker's placement: the memory its models may hold, and how long
# an idle on-demand model stays.
PLACEMENT = frozenset({"memory_budget_mb", "idle_evict_s"})
# flotilla.tune: the models, where tuned profiles go, the laws multilingual models calibrate on.
TUNE = MODELS | {"tuned_file", "calibration_dir", "log_level"}
# wiring.adapter_catalog(): Settings.adapters_root, where adapters are found or registered.
ADAPTERS = frozenset({"adapters_dir", "data_dir"})
# wiring.model_host()'s sections requests and ocr: requests are decoded, and cut or refused,
# and OCR documents read, and refused, where the models run.
DECODING = frozenset(section_settings("requests") + section_settings("ocr"))
# wiring.gateway_config() and run_http(): authorization, body and deadline limits, admission
# (the gateway section), the token estimate, the OCR request's pages and size, and
# model:adapter names resolved against the fleet and the adapters.
HTTP_API = ADAPTERS | {
    "host",
    "port",
    "log_level",
    "fleet",
    "api_keys",
    "request_timeout_s",
    "max_body_bytes",
    "header_timeout_s",
    "body_timeout_s",
    "max_inflight_tokens",
    "bytes_per_token",
    "ocr_max_pages",
    "ocr_max_document_bytes",
}
# wiring.configured_store(): the embedded store under data_dir, or a Qdrant server.
STORE = frozenset(
    {
        "store",
        "qdrant_url",
        "qdrant_api_key",
        "qdrant_ca_file",
        "qdrant_client_cert",
        "qdrant_client_key",
        "data_dir",
    }
)
# wiring.local_stack()'s IngestCore: record_rules(), its QueueEmbedder and its chunking.
CHUNKING = frozenset({"chunking", "chunk_max_tokens", "chunk_overlap_tokens"})
RECORDS = CHUNKING | {
    "collection",
    "ingest_model",
    "ingest_ocr_model",
    "ingest_max_text_bytes",
    "bytes_per_token",
    "auto_truncate",
}
# wiring.kafka_source() (ingest_max_records also sizes the chunks of `ingest --from`), and
# the security of every Kafka client (ingest.kafka_clients).
KAFKA_INGEST = frozenset(
    {"kafka", "topic", "group", "ingest_max_records", "dlq_create"}
    | set(section_settings("kafka_security"))
)
# wiring.configure_tracing(): where the processes that serve or ingest send their spans.
TRACING = frozenset({"otlp_endpoint"})
# flotilla.progress: the plain lines of a long command whose output is not a terminal.
PROGRESS = frozenset({"progress_interval_s"})
# Both halves of the JetStream work queue and the worker liveness, and the security of
# their connections; the reply subject is the gateway's own.
WORK_QUEUE = frozenset({"nats", *section_settings("jetstream"), *section_settings("nats_security")})


def _names(name: str, also: Mapping[str, str] | None) -> tuple[str, ...]:
    """A setting's flag names: none given lets Typer derive it (--<name>, --no-<name> for
    a bool); a second name gets both spelled out."""
    if also is None or name not in also:
        return ()
    return (f"--{name.replace('_', '-')}", also[name])


def _flag_type(annotation: Any) -> Any:
    """The type Typer parses a flag as; pydantic validates the value afterwards."""
    origin = typing.get_origin(annotation)
    if annotation in (int, float, bool, str):
        return annotation
    if annotation is Path or Path in typing.get_args(annotation):
        return Path
    if origin in (list, tuple):
        return str  # comma-separated, like the environment variable
    return str  # Literal and friends


def _shown_default(field: FieldInfo) -> Any:
    """A field's default as the flag's, for --help to show: a list as its comma-separated
    value, None when there is nothing to show (unset means what the description says)."""
    default = field.get_default(call_default_factory=True)
    if isinstance(default, list | tuple):
        return ",".join(map(str, default)) or None
    return default


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _problems(exc: ValidationError, cls: type[Settings]) -> str:
    """Each refused value under its setting's names (the flag, the variable), not its
    place in the nested settings. A secret's value is never shown, nor a whole section's
    (a check across its settings, whose message names them, sees them all)."""
    fields = setting_fields(cls)
    places: dict[tuple[str, ...], str] = {
        (where.field,) if where.section is None else (where.section, where.field): name
        for name, where in fields.items()
    }
    lines = []
    for error in exc.errors():
        loc = tuple(map(str, error["loc"]))
        name = places.get(loc[:1]) or places.get(loc[:2])
        where = f"--{name.replace('_', '-')} / FLOTILLA_{name.upper()}" if name else ".".join(loc)
        secret = name is not None and _is_secret(fields[name].info.annotation)
        hidden = secret or isinstance(error["input"], dict)
        lines.append(f"{where}: {error['msg']}" + ("" if hidden else f" (got {error['input']!r})"))
    return "\n".join(lines)


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
ENVIRONMENT_NOTE = "Settings are also FLOTILLA_<NAME> environment variables; a flag wins."


def settings_flags(
    reads: Iterable[str],
    cls: type[Settings] = Settings,
    *,
    also: Mapping[str, str] | None = None,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give ``func(settings, ...)`` a flag per setting of ``cls`` (Settings or a subclass
    that adds a command's own settings). Those in ``reads``, the settings the command uses, are
    shown in their GROUPS panel with their defaults; the others are hidden but accepted,
    as every FLOTILLA_* variable is, so that one list of flags or one environment serves
    every process of a deployment. Only flags given on the command line reach ``cls``,
    which reads the environment for the rest. ``also`` gives a setting a second flag name
    on this command (``{"ingest_model": "--model"}``)."""
    fields = {name: where.info for name, where in setting_fields(cls).items()}
    panel = {name: title for title, names in GROUPS.items() for name in names}
    if unplaced := set(fields) - set(panel):
        raise TypeError(f"settings in no GROUPS panel: {sorted(unplaced)}")
    shown = frozenset(reads)
    if unknown := shown - set(fields):
        raise TypeError(f"not settings of {cls.__name__}: {sorted(unknown)}")
    ordered = [name for names in GROUPS.values() for name in names if name in fields]
    for name in also or {}:
        if fields[name].annotation is bool:
            raise TypeError(f"{name} is a --x/--no-x flag: a second name would lose --no-x")

    def decorate(func: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(func, include_extras=True)  # Annotated flags survive
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(func).parameters.values()
            if p.name != "settings"
        ]
        # The context says which flags were given; the command's own, or one just for this.
        ctx_name = next((p.name for p in own if p.annotation is typer.Context), None)
        if ctx_name is None:
            own.append(inspect.Parameter("context", KEYWORD_ONLY, annotation=typer.Context))
        setting_params = [
            inspect.Parameter(
                name,
                KEYWORD_ONLY,
                default=typer.Option(
                    _shown_default(fields[name]),
                    *_names(name, also),
                    help=fields[name].description,
                    rich_help_panel=panel[name],
                    hidden=name not in shown,
                ),
                annotation=_flag_type(fields[name].annotation) | None,
            )
            for name in ordered
        ]

        @functools.wraps(func)
        def wrapper(**kwargs: Any) -> None:
            given = {k: kwargs.pop(k) for k in list(kwargs) if k in fields}
            # Only the flags on the command line: a flag's default is there for --help, and
            # must not shadow the environment variable.
            ctx: typer.Context = kwargs[ctx_name] if ctx_name else kwargs.pop("context")
            flags = {k: v for k, v in given.items() if _on_command_line(ctx, k)}
            try:  # by their names: Settings puts a section's into its section
                settings = cls(**flags)
            except ValidationError as exc:
                raise typer.BadParameter(_problems(exc, cls)) from exc
            try:
                func(settings, **kwargs)
            except FleetError as exc:  # a missing or malformed fleet file: a usage error
                # The fleet-state file's errors name their own setting.
                hint = getattr(exc, "param_hint", "'--fleet' / FLOTILLA_FLEET")
                raise typer.BadParameter(exc.message, param_hint=hint) from exc

        # The summary on one line: Typer's command lists keep its line breaks.
        summary, _, rest = inspect.cleandoc(func.__doc__ or "").partition("\n\n")
        paragraphs = [summary.replace("\n", " "), rest, ENVIRONMENT_NOTE]
        wrapper.__doc__ = "\n\n".join(p for p in paragraphs if p)
        wrapper.__signature__ = inspect.Signature(own + setting_params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in own + setting_params}
        return wrapper

    return decorate
