"""The admin API (gateway.admin): only an admin key opens it; a model added is served at
once, one removed under load finishes its requests in flight and takes no new ones;
entries are validated as the fleet file's, each refusal naming the field."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from embedder.core.fleet import ModelSpec
from gateway.config import GatewayLimits
from tests.gateway.fake_admin import (
    ADMIN_KEY,
    CLIENT_KEY,
    SOURCE,
    FakeFleetHost,
    admin_app,
)

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CLIENT = {"authorization": f"Bearer {CLIENT_KEY}"}


@dataclass
class Admin:
    client: httpx.AsyncClient
    host: FakeFleetHost

    async def add(self, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post("/admin/models", json=body, headers=ADMIN)

    async def embed(self, model: str) -> httpx.Response:
        body = {"model": model, "input": "a short text"}
        return await self.client.post("/v1/embeddings", json=body, headers=CLIENT)


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    app, host = admin_app()
    transport = httpx.ASGITransport(app=app)
    async with (
        host.running_worker(),
        httpx.AsyncClient(transport=transport, base_url="http://flotilla.test") as client,
    ):
        yield Admin(client, host)


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait (up to 10 s) for ``check``; a broken test fails instead of hanging."""
    try:
        async with asyncio.timeout(10):
            while not check():  # noqa: ASYNC110 - counters of the fake host
                await asyncio.sleep(0.005)
    except TimeoutError:
        pytest.fail(f"waited 10 s for {what}")


# -- who may call ----------------------------------------------------------------------


ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/admin/models", None),
    ("POST", "/admin/models", {"name": "new", "source": SOURCE}),
    ("DELETE", "/admin/models/judge", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=["list", "add", "remove"])
@pytest.mark.parametrize(
    "authorization",
    [None, f"Bearer {CLIENT_KEY}", "Bearer wrong", f"Basic {ADMIN_KEY}", ADMIN_KEY],
    ids=["no key", "client key", "unknown key", "another scheme", "no scheme"],
)
async def test_only_an_admin_key_opens_the_admin_api(
    admin: Admin, method: str, path: str, body: dict[str, Any] | None, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"authorization": authorization}
    response = await admin.client.request(method, path, json=body, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "--admin-keys" in response.json()["error"]
    assert set(admin.host.fleet.models) == {"alpha", "judge"}  # nothing changed


async def test_the_admin_key_is_no_client_key(admin: Admin) -> None:
    response = await admin.client.post(
        "/v1/embeddings", json={"model": "alpha", "input": "x"}, headers=ADMIN
    )
    assert response.status_code == 401


def test_a_key_cannot_be_both_a_client_and_an_admin_key() -> None:
    with pytest.raises(ValidationError, match="both --api-keys and --admin-keys"):
        GatewayLimits(api_keys=("a", "shared"), admin_keys=("shared",))


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=["list", "add", "remove"])
async def test_without_admin_keys_the_routes_say_how_to_turn_them_on(
    method: str, path: str, body: dict[str, Any] | None
) -> None:
    app, host = admin_app(admin_keys=())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.request(method, path, json=body, headers=ADMIN)
        document = (await client.get("/openapi.json")).json()
    assert response.status_code == 404
    assert "the admin API is off" in response.json()["error"]
    assert "--admin-keys" in response.json()["error"]
    assert not any(p.startswith("/admin") for p in document["paths"])
    assert "AdminModelEntry" not in document["components"]["schemas"]
    assert set(host.fleet.models) == {"alpha", "judge"}


# -- add, use, remove under load -------------------------------------------------------


async def test_a_model_added_serves_and_removed_under_load_finishes_its_requests(
    admin: Admin,
) -> None:
    assert (await admin.embed("added")).status_code == 404
    response = await admin.add({"name": "added", "source": SOURCE, "aliases": ["org/added"]})
    assert response.status_code == 201, response.text
    assert response.json()["kept"].startswith("lasts until the server stops")
    used = await admin.embed("org/added")
    assert used.status_code == 200, used.text
    assert used.json() == {"model": "added"}

    admin.host.gate.clear()  # the worker takes jobs but answers none
    in_flight = [asyncio.create_task(admin.embed("added")) for _ in range(3)]
    await until(lambda: len(admin.host.pulled) == 4, "three jobs taken")
    removal = asyncio.create_task(admin.client.delete("/admin/models/added", headers=ADMIN))
    await until(lambda: admin.host.removals_started == ["added"], "the removal to start")
    late = await admin.embed("added")
    assert late.status_code == 404  # gone for new requests at once ...
    await asyncio.sleep(0.05)
    assert not removal.done()  # ... while the removal waits for the ones in flight
    admin.host.gate.set()
    answers = await asyncio.gather(*in_flight)
    assert [(r.status_code, r.json()) for r in answers] == [(200, {"model": "added"})] * 3
    removed = await removal
    assert removed.status_code == 200, removed.text
    assert removed.json()["name"] == "added"
    listing = (await admin.client.get("/admin/models", headers=ADMIN)).json()
    assert [m["name"] for m in listing["data"]] == ["alpha", "judge"]


async def test_the_listing_has_each_entry_and_state(admin: Admin) -> None:
    response = await admin.client.get("/admin/models", headers=ADMIN)
    assert response.status_code == 200
    listing = response.json()
    assert listing["object"] == "list"
    assert listing["kept"].startswith("lasts until the server stops")
    alpha, judge = listing["data"]
    assert alpha["name"] == "alpha" and alpha["task"] == "embed"
    assert alpha["aliases"] == ["org/alpha"]
    assert (alpha["load"], alpha["pinned"]) == ("start", True)
    assert (judge["load"], judge["pinned"]) == ("on_demand", False)
    assert alpha["state"] == "ready" and alpha["details"] == {"runtime": "fake"}
    assert alpha["entry"]["source"]["path"] == SOURCE["path"]
    assert alpha["entry"]["max_tokens"] == 512  # every field, defaults included
    assert "name" not in alpha["entry"]  # the row's key, as the fleet file's
    assert judge["entry"]["task"] == "rerank"


# -- what an entry must be -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (
            {"profiles": {"cpu": {"max_batch_tokens": 0}}},
            "profiles.cpu.max_batch_tokens: Input should be greater than 0 (got 0)",
        ),
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        ({"load": "sometimes"}, "load: Input should be 'start' or 'on_demand'"),
        ({"task": "paint"}, "task 'paint' is not a task kind; known: embed, generate, ocr"),
        ({"source": {"path": "/m", "package": "p"}}, "source: Value error, a source needs"),
        ({"source": None}, "source: Input should be a valid dictionary"),
        ({"task": "generate", "prompts": {"q": "x"}}, "prompts: Extra inputs are not permitted"),
        ({"adapters": {"legal": "adapters/legal"}}, "adapters.legal: 'adapters/legal' is rel"),
    ],
    ids=["range", "unknown", "literal", "task", "source", "no source", "kind", "relative"],
)
async def test_an_entry_is_refused_as_the_fleet_file_would_naming_the_field(
    admin: Admin, body: dict[str, Any], named: str
) -> None:
    response = await admin.add({"name": "new", "source": SOURCE, **body})
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["error_type"] == "invalid_request"
    assert named in error["error"]
    assert "new" not in admin.host.fleet.models


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "the body is not JSON"),
        (b"[1, 2]", "send a JSON object"),
        (b'{"source": {"path": "/m"}}', "name: the model's name is required"),
        (b'{"name": "", "source": {"path": "/m"}}', "name: the model's name is required"),
        (b'{"name": 7, "source": {"path": "/m"}}', "name: the model's name is required"),
        (b"[" * 100 + b"]" * 100, "nest"),
    ],
    ids=["malformed", "array", "no name", "empty name", "numeric name", "deep"],
)
async def test_a_body_that_is_no_named_entry_is_refused(
    admin: Admin, content: bytes, message: str
) -> None:
    response = await admin.client.post("/admin/models", content=content, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]


@pytest.mark.parametrize(
    ("body", "taken", "owner"),
    [
        ({"name": "alpha"}, "alpha", "alpha"),
        ({"name": "org/alpha"}, "org/alpha", "alpha"),  # another model's alias
        ({"name": "new", "aliases": ["judge"]}, "judge", "judge"),
        ({"name": "new", "aliases": ["x", "org/alpha"]}, "org/alpha", "alpha"),
    ],
    ids=["name", "name is an alias", "alias is a name", "alias is an alias"],
)
async def test_a_name_or_alias_in_use_is_a_conflict(
    admin: Admin, body: dict[str, Any], taken: str, owner: str
) -> None:
    response = await admin.add({"source": SOURCE, **body})
    assert response.status_code == 409
    error = response.json()
    assert error["error_type"] == "model_exists"
    assert f"{taken!r} is taken by model {owner!r}" in error["error"]
    assert set(admin.host.fleet.models) == {"alpha", "judge"}


async def test_a_clash_the_host_finds_is_a_conflict_too() -> None:
    """Two adds of one name at once both pass the gateway's check; the host refuses one."""
    app, host = admin_app()

    async def add_model(spec: ModelSpec) -> None:
        raise ValueError(f"model {spec.name!r} is in the fleet already; remove it first")

    host.add_model = add_model  # type: ignore[method-assign]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post(
            "/admin/models", json={"name": "new", "source": SOURCE}, headers=ADMIN
        )
    assert response.status_code == 409
    assert "in the fleet already" in response.json()["error"]


@pytest.mark.parametrize(
    ("name", "status", "message"),
    [
        ("missing", 404, "model 'missing' is not in the fleet; available: alpha, judge"),
        ("org/alpha", 404, "'org/alpha' is an alias of 'alpha': remove it by its name"),
    ],
)
async def test_removing_what_is_not_a_model_name_is_not_found(
    admin: Admin, name: str, status: int, message: str
) -> None:
    response = await admin.client.delete(f"/admin/models/{name}", headers=ADMIN)
    assert response.status_code == status
    assert message in response.json()["error"]


async def test_the_last_model_stays(admin: Admin) -> None:
    assert (await admin.client.delete("/admin/models/judge", headers=ADMIN)).status_code == 200
    response = await admin.client.delete("/admin/models/alpha", headers=ADMIN)
    assert response.status_code == 409
    assert response.json()["error_type"] == "fleet_conflict"
    assert "a fleet needs one model" in response.json()["error"]


async def test_a_model_removed_can_be_added_again(admin: Admin) -> None:
    assert (await admin.client.delete("/admin/models/judge", headers=ADMIN)).status_code == 200
    again = await admin.add({"name": "judge", "task": "embed", "source": SOURCE})
    assert again.status_code == 201
    assert (await admin.embed("judge")).json() == {"model": "judge"}


# -- documented ------------------------------------------------------------------------


async def test_the_admin_routes_are_documented_under_their_tag(admin: Admin) -> None:
    document = (await admin.client.get("/openapi.json")).json()
    paths = document["paths"]
    listing, adding = paths["/admin/models"]["get"], paths["/admin/models"]["post"]
    removing = paths["/admin/models/{model}"]["delete"]
    for route in (listing, adding, removing):
        assert route["tags"] == ["admin"]
        assert "401" in route["responses"]
    assert (
        "AdminModels"
        in listing["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    )
    assert set(adding["responses"]) >= {"201", "409", "422"} and "200" not in adding["responses"]
    body = adding["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    entry = document["components"]["schemas"][body.rsplit("/", 1)[1]]
    assert entry["required"] == ["name", "source"]
    assert "409" in removing["responses"]
