"""The Helm chart (deploy/helm/flotilla), linted and rendered by the pinned helm, and what
it renders checked against the code it deploys: every command and flag parsed by the
`flotilla` command's own parser, every variable a setting the command reads, every probe
a route its server answers, the workers' grace longer than their drain, and every KEDA
trigger naming the stream and consumers that the workers' own settings create."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer.main
import yaml
from fastapi import FastAPI
from fastapi.routing import APIRoute
from typer.core import TyperGroup

import flotilla
from bench.services.nats import NatsServer
from bench.services.nats.server import free_port
from deploy.helm_binary import VERSION, helm_path
from embedder.core.fleet import Fleet
from embedder.core.jobs import ApiShape, Job
from embedder.queue.jetstream.puller import JetStreamPuller
from embedder.queue.jetstream.submitter import JetStreamSubmitter
from embedder.tasks.fleet import DEFAULT_FLEET, load_fleet, parse_fleet
from flotilla.cli import app
from flotilla.distributed import DRAIN_S, build_gateway_app
from flotilla.http_server import server_config
from flotilla.settings import Settings, setting_fields
from flotilla.worker_http import WorkerHttp

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "flotilla"
GROUPS_VALUES = CHART / "ci" / "groups-values.yaml"
# What a Secret would hold: any value the setting accepts.
SECRET_PLACEHOLDER = "from-a-secret"


@pytest.fixture(scope="module")
def helm() -> Path:
    path = helm_path()
    if not path.is_file():
        pytest.skip(f"helm {VERSION} is not built: `make helm` builds it once into {path}")
    found = run_helm(path, "version", "--template", "{{.Version}}")
    assert found == VERSION, f"{path} is helm {found}: remove it, and `make helm` builds {VERSION}"
    return path


def run_helm(helm: Path, *args: str | Path) -> str:
    done = subprocess.run([helm, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"helm {' '.join(map(str, args))}:\n{done.stdout}{done.stderr}"
    return done.stdout


def render(helm: Path, *args: str | Path) -> list[dict[str, Any]]:
    return [
        d for d in yaml.safe_load_all(run_helm(helm, "template", "flotilla", CHART, *args)) if d
    ]


def render_fails(helm: Path, *args: str) -> str:
    done = subprocess.run(
        [helm, "template", "flotilla", CHART, *args], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0, "rendered, but should have failed"
    return done.stderr


@dataclass(frozen=True)
class Rendered:
    docs: list[dict[str, Any]]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [d for d in self.of(kind) if d["metadata"]["name"] == name]
        return found

    def containers(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        for deployment in self.of("Deployment"):
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                yield deployment, container

    def fleet_file(self, deployment: dict[str, Any], path: str) -> Fleet:
        """The fleet file at ``path`` in a deployment's container, read from its ConfigMap."""
        spec = deployment["spec"]["template"]["spec"]
        (mount,) = [
            m for m in spec["containers"][0]["volumeMounts"] if path.startswith(m["mountPath"])
        ]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        data = self.named("ConfigMap", volume["configMap"]["name"])["data"]
        return parse_fleet(yaml.safe_load(data[path.removeprefix(mount["mountPath"] + "/")]))


@pytest.fixture(scope="module", params=["defaults", "groups"])
def rendered(request: pytest.FixtureRequest, helm: Path) -> Rendered:
    extra = ["-f", str(GROUPS_VALUES)] if request.param == "groups" else []
    return Rendered(render(helm, *extra))


def parsed_command(command: list[str]) -> tuple[Any, Any]:
    """The container's command as `flotilla` parses it: an unknown subcommand or flag, or a
    flag's value of the wrong type, fails here as it would in the pod."""
    assert command[0] == "flotilla"
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    sub = group.commands.get(command[1])
    assert sub is not None, f"not a flotilla subcommand: {command[1]}"
    return sub, sub.make_context(command[1], list(command[2:]))


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", SECRET_PLACEHOLDER) for e in container["env"]}


def settings_of(container: dict[str, Any]) -> Settings:
    """The settings the container's process reads: its variables, then its flags (the
    environment otherwise clean: ``clean_env``)."""
    _, ctx = parsed_command(container["command"])
    given = {
        name: value
        for name, value in ctx.params.items()
        if name in setting_fields(Settings) and ctx.get_parameter_source(name).name == "COMMANDLINE"
    }
    with pytest.MonkeyPatch.context() as environment:
        for name, value in env_of(container).items():
            environment.setenv(name, value)
        return Settings(**given)


def test_the_chart_lints_with_its_defaults_and_with_groups(helm: Path) -> None:
    run_helm(helm, "lint", "--strict", CHART)
    run_helm(helm, "lint", "--strict", CHART, "-f", GROUPS_VALUES)


def test_the_chart_is_this_flotilla_and_its_fleet_the_bundled_one() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == flotilla.__version__
    assert (CHART / "files" / "fleet.yaml").read_bytes() == DEFAULT_FLEET.read_bytes()


def test_every_command_is_a_flotilla_subcommand_with_real_flags(rendered: Rendered) -> None:
    commands = {}
    for deployment, container in rendered.containers():
        sub, ctx = parsed_command(container["command"])
        commands[deployment["metadata"]["labels"]["app.kubernetes.io/component"]] = sub.name
        fleet = ctx.params["fleet"]
        assert fleet is not None and rendered.fleet_file(deployment, str(fleet)).models
    assert commands == {"gateway": "gateway", "worker": "worker", "ingest": "ingest"}


@pytest.mark.usefixtures("clean_env")
def test_every_variable_is_a_setting_its_command_reads(
    rendered: Rendered,
) -> None:
    for _, container in rendered.containers():
        sub, _ = parsed_command(container["command"])
        shown = {p.name for p in sub.params if p.param_type_name == "option" and not p.hidden}
        for name in env_of(container):
            assert name.startswith("FLOTILLA_"), name
            setting = name.removeprefix("FLOTILLA_").lower()
            assert setting in setting_fields(Settings), f"{name} is no setting"
            assert setting in shown, f"`flotilla {sub.name}` does not read {name}"
        settings_of(container)  # every value is one the setting accepts


def probes(container: dict[str, Any]) -> dict[str, str]:
    return {
        kind: container[kind]["httpGet"]["path"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
        if kind in container
    }


@pytest.mark.usefixtures("clean_env")
def test_the_gateway_probes_routes_of_the_gateway_app(rendered: Rendered) -> None:
    gateway = rendered.named("Deployment", "flotilla-gateway")["spec"]["template"]["spec"]
    (container,) = gateway["containers"]
    found = probes(container)
    assert found == {"livenessProbe": "/health", "readinessProbe": "/ready"}
    api = build_gateway_app(Settings(nats="nats://127.0.0.1:1", store="edge"))
    get_routes = {
        r.path for r in api.routes if isinstance(r, APIRoute) and "GET" in (r.methods or ())
    }
    assert set(found.values()) <= get_routes


async def test_the_worker_probes_answer_on_a_real_worker_port(rendered: Rendered) -> None:
    workers = [
        (d, c) for d, c in rendered.containers() if c["command"][:2] == ["flotilla", "worker"]
    ]
    assert workers
    async with (
        WorkerHttp("127.0.0.1", 0, lambda: True) as http,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{http.bound_port}") as client,
    ):
        for _, container in workers:
            (port,) = container["ports"]
            found = probes(container)
            assert set(found) == {"startupProbe", "livenessProbe", "readinessProbe"}
            for kind, path in found.items():
                assert container[kind]["httpGet"]["port"] == port["name"]
                assert (await client.get(path)).status_code == 200, path
            _, ctx = parsed_command(container["command"])
            assert ctx.params["worker_port"] == port["containerPort"]


def test_the_workers_grace_outlasts_their_drain(rendered: Rendered) -> None:
    workers = [
        d
        for d in rendered.of("Deployment")
        if d["spec"]["template"]["spec"]["containers"][0]["name"] == "worker"
    ]
    assert workers
    for deployment in workers:
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > DRAIN_S, deployment["metadata"]["name"]


@pytest.mark.usefixtures("clean_env")
def test_the_gateways_grace_outlasts_their_hand_over_and_shutdown(rendered: Rendered) -> None:
    """The Service lets go of a stopping gateway during its preStop sleep; then uvicorn
    gives requests in flight their time: the kubelet waits for both."""
    spec = rendered.named("Deployment", "flotilla-gateway")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    shutdown = server_config(FastAPI(), Settings()).timeout_graceful_shutdown
    assert shutdown is not None
    assert spec["terminationGracePeriodSeconds"] > float(command[1]) + shutdown


@pytest.mark.usefixtures("clean_env")
def test_each_group_scales_on_the_consumers_its_workers_create(
    rendered: Rendered,
) -> None:
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in rendered.of("ScaledObject")}
    workers = [(d, c) for d, c in rendered.containers() if c["name"] == "worker"]
    assert workers
    for deployment, container in workers:
        settings = settings_of(container)
        queue = settings.jetstream
        models = list(rendered.fleet_file(deployment, str(settings.fleet)).models)
        scaler = scaled[deployment["metadata"]["name"]]
        triggers = scaler["spec"]["triggers"]
        lanes = [lane for m in models for lane in queue.lanes(m)]
        assert [t["type"] for t in triggers] == ["nats-jetstream"] * len(lanes)
        assert [t["metadata"]["consumer"] for t in triggers] == list(
            map(queue.lane_consumer, lanes)
        )
        assert {t["metadata"]["stream"] for t in triggers} == {queue.stream}
        subjects = scaler["metadata"]["annotations"]["flotilla/subjects"].split(",")
        assert subjects == list(map(queue.lane_subject, lanes))


def test_autoscaled_deployments_leave_the_count_to_their_scaler(rendered: Rendered) -> None:
    """An upgrade that set a replica count would undo what the autoscaler chose."""
    targets = [s["spec"]["scaleTargetRef"]["name"] for s in rendered.of("ScaledObject")]
    targets += [h["spec"]["scaleTargetRef"]["name"] for h in rendered.of("HorizontalPodAutoscaler")]
    assert len(targets) == len(rendered.of("Deployment"))
    for name in targets:
        assert "replicas" not in rendered.named("Deployment", name)["spec"], name


def keda_lag(monitoring: str, trigger: dict[str, str]) -> int | None:
    """What KEDA's nats-jetstream scaler reads for a trigger: the server's /jsz for the
    account, that account's stream, and in it the consumer's pending plus unacknowledged
    messages; None where it finds no such consumer (KEDA then counts the whole stream)."""
    query = {"acc": trigger["account"], "consumers": "true", "config": "true"}
    jsz = httpx.get(f"http://{monitoring}/jsz", params=query).json()
    accounts = [a for a in jsz["account_details"] if a["name"] == trigger["account"]]
    streams = [s for a in accounts for s in a["stream_detail"] if s["name"] == trigger["stream"]]
    consumers = [
        c for s in streams for c in s["consumer_detail"] if c["name"] == trigger["consumer"]
    ]
    if not consumers:
        return None
    (consumer,) = consumers
    return int(consumer["num_pending"]) + int(consumer["num_ack_pending"])


@pytest.mark.slow
@pytest.mark.usefixtures("clean_env")
async def test_keda_counts_on_each_trigger_the_requests_for_its_model(helm: Path) -> None:
    """A group's workers, configured as the chart configures them, against a real
    nats-server: once they started (their consumers made), a request the gateway queued
    for the group's second model is what KEDA finds on the trigger of that model's lane
    for the request's deadline, and nothing on the others; the worker's own count of
    waiting requests agrees."""
    rendered = Rendered(render(helm, "-f", str(GROUPS_VALUES)))
    deployment = rendered.named("Deployment", "flotilla-worker-encoders")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    settings = settings_of(container)
    models = list(rendered.fleet_file(deployment, str(settings.fleet)).models)
    triggers = rendered.named("ScaledObject", "flotilla-worker-encoders")["spec"]["triggers"]
    monitoring = f"127.0.0.1:{free_port()}"
    now = time.time()
    job = Job(
        id="one", model=models[1], shape=ApiShape.TEI_EMBED, body=b'{"inputs": "x"}',
        est_tokens=3, deadline=now + 60, enqueued_at=now,
    )  # fmt: skip
    with NatsServer(extra_config=f"http: {monitoring}") as server:
        puller = JetStreamPuller(url=server.url, config=settings.jetstream)
        submitter = JetStreamSubmitter(
            url=server.url, inbox="flotilla.replies.test", config=settings.jetstream
        )
        async with puller, submitter:
            assert await puller.waiting(models) == {models[0]: 0, models[1]: 0}
            await submitter.put(job)
            assert await puller.waiting(models) == {models[0]: 0, models[1]: 1}
            seen = [keda_lag(monitoring, t["metadata"]) for t in triggers]
    lane = settings.jetstream.lane_of(job.model, job.budget_s)
    wanted = settings.jetstream.lane_consumer(lane)
    assert seen == [int(t["metadata"]["consumer"] == wanted) for t in triggers]
    assert sum(seen) == 1 and len(triggers) == 2 * len(settings.jetstream.lanes(models[0]))


def test_the_default_groups_keep_a_warm_floor(helm: Path) -> None:
    (scaler,) = [
        s
        for s in Rendered(render(helm)).of("ScaledObject")
        if s["metadata"]["name"].startswith("flotilla-worker")
    ]
    assert scaler["spec"]["minReplicaCount"] >= 1


def test_groups_take_their_own_models_resources_and_scale(helm: Path) -> None:
    rendered = Rendered(render(helm, "-f", str(GROUPS_VALUES)))
    groups = yaml.safe_load(GROUPS_VALUES.read_text())["workers"]["groups"]
    for group in groups:
        deployment = rendered.named("Deployment", f"flotilla-worker-{group['name']}")
        spec = deployment["spec"]["template"]["spec"]
        fleet = rendered.fleet_file(deployment, spec["containers"][0]["command"][-1])
        assert list(fleet.models) == group["models"]
        gpus = spec["containers"][0]["resources"].get("limits", {}).get("nvidia.com/gpu", 0)
        assert gpus == group.get("gpu", {"count": 1})["count"]
        scaler = rendered.named("ScaledObject", f"flotilla-worker-{group['name']}")["spec"]
        assert scaler["minReplicaCount"] == group.get("minReplicas", 2)  # the workers' own: 2
    chat = rendered.named("Deployment", "flotilla-worker-chat")["spec"]["template"]["spec"]
    assert chat["terminationGracePeriodSeconds"] == 45


@pytest.mark.usefixtures("clean_env")
def test_ingest_scales_on_the_lag_of_its_own_group_and_topic(
    rendered: Rendered,
) -> None:
    (container,) = [c for _, c in rendered.containers() if c["name"] == "ingest"]
    settings = settings_of(container).ingest
    (trigger,) = rendered.named("ScaledObject", "flotilla-ingest")["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert (meta["bootstrapServers"], meta["consumerGroup"], meta["topic"]) == (
        settings.bootstrap,
        settings.group,
        settings.topic,
    )


def test_the_fleet_in_its_configmap_is_the_bundled_fleet(helm: Path) -> None:
    """Same models, same order (the first is the default model), same entries; the bundled
    adapter read from where the image installs flotilla, or from wherever relativeTo says."""
    embedder_dir = DEFAULT_FLEET.parent
    rendered = Rendered(render(helm, "--set", f"fleet.relativeTo={embedder_dir}"))
    gateway = rendered.named("Deployment", "flotilla-gateway")
    assert rendered.fleet_file(gateway, "/etc/flotilla/fleet/fleet.yaml") == load_fleet()
    python = re.search(r"^FROM python:(\d+\.\d+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert python is not None
    relative_to = yaml.safe_load((CHART / "values.yaml").read_text())["fleet"]["relativeTo"]
    assert relative_to == f"/usr/local/lib/python{python[1]}/site-packages/embedder"


def test_the_values_schema_admits_the_settings_and_no_other_variable(helm: Path) -> None:
    """values.schema.json lists every setting's variable, so that helm refuses a misspelled
    one at install; a setting added to flotilla is a name added there."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$defs"]["setting"]["enum"] == sorted(
        f"FLOTILLA_{name.upper()}" for name in setting_fields(Settings)
    )
    assert "FLOTILLA_NATS_STREEM" in render_fails(
        helm, "--set", "gateway.env.FLOTILLA_NATS_STREEM=x"
    )
    assert "'worker' not allowed" in render_fails(helm, "--set", "worker.minReplicas=2")


def test_a_fleet_of_ones_own_keeps_its_order_and_its_adapters(helm: Path) -> None:
    rendered = Rendered(render(helm, "-f", str(GROUPS_VALUES)))
    given = yaml.safe_load(yaml.safe_load(GROUPS_VALUES.read_text())["fleet"]["content"])
    gateway = rendered.named("Deployment", "flotilla-gateway")
    fleet = rendered.fleet_file(gateway, "/etc/flotilla/fleet/fleet.yaml")
    assert list(fleet.models) == list(given["models"])  # the first is the default model
    relative_to = yaml.safe_load((CHART / "values.yaml").read_text())["fleet"]["relativeTo"]
    assert fleet.models["e5.small_v2"].adapters == {
        "gesetze": Path(relative_to, "bundled_adapters/multilingual-e5-small/gesetze"),
        "own": Path("/adapters/e5/own"),
    }


def test_values_the_chart_cannot_honour_fail_with_the_reason(helm: Path) -> None:
    unknown = render_fails(
        helm, "--set", "workers.groups[0].name=x", "--set", "workers.groups[0].models[0]=nope"
    )
    assert 'model "nope" is not in the fleet' in unknown
    clash = render_fails(helm, "--set", "workers.env.FLOTILLA_NATS_STREAM=OTHER")
    assert "FLOTILLA_NATS_STREAM is set by this chart from its values" in clash
    twice = render_fails(helm, "--set-json", 'workers.groups=[{"name": "all"}, {"name": "all"}]')
    assert '"all" names two groups' in twice
    storeless = render_fails(helm, "--set", "qdrant.url=")
    assert "set qdrant.url, or ingest.enabled=false" in storeless


def leaf_paths(values: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from leaf_paths(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


def test_the_guide_describes_every_value() -> None:
    """Each value of values.yaml is in the guide's table, itself or a map holding it (as
    `gateway.resources`): a value added to the chart is a row added to the guide."""
    guide = (ROOT / "docs" / "guide" / "kubernetes.md").read_text()
    named = set(re.findall(r"`([A-Za-z][\w.]*)`", guide))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = []
    for path in leaf_paths(values):
        parts = path.split(".")
        prefixes = {".".join(parts[:n]) for n in range(min(2, len(parts)), len(parts) + 1)}
        if not prefixes & named:
            missing.append(path)
    assert missing == []
