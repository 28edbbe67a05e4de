"""`flotilla models add|remove|list --server URL`: the admin API of a running server
(``gateway.admin``), with the first key of --admin-keys.

``add`` reads a YAML file of entries by name, as the fleet file's ``models:`` holds
them (one or several), and adds them in the file's order; a relative adapter folder is
read from beside the file, as the fleet file's are, and sent as an absolute path (the
server has no file to read it beside). The first refusal stops it: the message says
what the server said, and which entries were added before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

from embedder.core.errors import FlotillaError
from embedder.tasks.fleet import adapters_beside

# Removing a model waits for its queued and running jobs, each within its deadline.
TIMEOUT = httpx.Timeout(600.0, connect=10.0)


class AdminRefused(FlotillaError):
    """The server refused an admin request, or could not be reached."""

    code = "admin_refused"


def read_entries(path: Path) -> dict[str, dict[str, Any]]:
    """The file's entries by name, relative adapter folders made absolute beside it."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AdminRefused(f"cannot read {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise AdminRefused(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict) or not raw:
        raise AdminRefused(
            f"{path} must map each model's name to its entry, as the fleet file's 'models:' "
            "does, e.g.\n  legal-embed:\n    source: {path: /models/legal-embed}"
        )
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise AdminRefused(f"{path}: model {name!r}: an entry is a mapping")
    adapters_beside({"models": raw}, path.resolve().parent)
    return {str(name): entry for name, entry in raw.items()}


class AdminClient:
    """One server's admin API; each call returns the answer's JSON or raises AdminRefused
    with the server's message."""

    def __init__(
        self, server: str, key: str | None, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.server = server.rstrip("/")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(
            base_url=self.server, headers=headers, timeout=TIMEOUT, transport=transport
        )

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.http.close()

    def list(self) -> dict[str, Any]:
        return self._call("GET", "/admin/models")

    def add(self, name: str, entry: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/admin/models", json={**entry, "name": name})

    def remove(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/admin/models/{quote(name, safe='/')}")

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AdminRefused(
                f"cannot reach {self.server} ({type(exc).__name__}: {exc}): is `flotilla "
                "serve` running there?"
            ) from exc
        if response.is_success:
            answer: dict[str, Any] = response.json()
            return answer
        message = _message(response)
        if response.status_code == 401:
            message += (
                "\nGive one of the server's admin keys with --admin-keys (FLOTILLA_ADMIN_KEYS);"
                " the first is sent."
            )
        raise AdminRefused(f"{self.server} answered {response.status_code}: {message}")


def _message(response: httpx.Response) -> str:
    """The server's error message (``{"error": ...}``), else the body as it came."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return str(error) if error else response.text.strip()


def rows(listing: dict[str, Any]) -> Iterator[str]:
    """One tab-separated line per model: name, task, state, load (pinned), source."""
    for model in listing.get("data", []):
        source = model.get("entry", {}).get("source", {})
        where = next((f"{k}:{v}" for k, v in source.items() if v is not None), "?")
        load = model["load"] + (", pinned" if model["pinned"] else "")
        yield f"{model['name']}\t{model['task']}\t{model['state']}\t{load}\t{where}"
