"""How flotilla's NATS connections are secured: TLS (the server verified against a CA
file, optionally a client certificate) and one way to authenticate (a .creds file, an
nkey seed, a user and password, or a token: the first of them set).
``flotilla.settings`` holds ``NatsSecurity`` as its ``nats_security`` section, each
field a setting named by its alias; ``connect`` in ``submitter`` opens every connection
through ``open_connection``.

A server that refuses the link's security (credentials, a certificate) fails the first
connection at once with a ``LinkRefused`` naming the setting, instead of the endless
reconnecting that waits out a server that is merely down. With TLS set, nothing is sent
over a link the server left unencrypted: a password or token is given only over TLS.
The model imports no nats, so the settings hold it without loading the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from embedder.core.errors import LinkRefused
from embedder.core.tls import TlsFiles, setting

if TYPE_CHECKING:
    from nats.aio.client import Client

log = logging.getLogger(__name__)

# What nats-server answers a CONNECT whose credentials it rejects, lower-cased.
AUTHORIZATION_REFUSED = ("authorization violation", "authentication expired", "revoked")
NO_TLS = "the server offers no TLS"
WAYS_IN = ("creds", "nkey_seed", "user", "token")  # the first one set is used
CLOSE_AFTER_REFUSAL_S = 0.5


class NatsSecurity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True)

    tls_ca: Path | None = Field(
        default=None,
        validation_alias="nats_tls_ca",
        description="CA file (PEM) the NATS server's certificate is verified against. "
        "Setting it, or another --nats-tls-* setting, makes every NATS connection TLS, "
        "refused when the server offers none; unset, a server that requires TLS is verified "
        "against the system's CAs.",
    )
    tls_cert: Path | None = Field(
        default=None,
        validation_alias="nats_tls_cert",
        description="Client certificate (PEM) for a NATS server that verifies its clients "
        "(tls { verify: true }); needs --nats-tls-key.",
    )
    tls_key: Path | None = Field(
        default=None,
        validation_alias="nats_tls_key",
        description="Private key (PEM) of --nats-tls-cert.",
    )
    tls_server_name: str | None = Field(
        default=None,
        validation_alias="nats_tls_server_name",
        description="Name the NATS server's certificate must hold, when the --nats URL "
        "reaches it by another (an IP address, a tunnel); the URL's host when unset.",
    )
    creds: Path | None = Field(
        default=None,
        validation_alias="nats_creds",
        description="NATS credentials file (.creds: a user JWT and its nkey seed, as `nsc` "
        "writes it) for servers in operator mode. One way in is used, the first set of: "
        "this, --nats-nkey-seed, --nats-user with --nats-password, --nats-token.",
    )
    nkey_seed: Path | None = Field(
        default=None,
        validation_alias="nats_nkey_seed",
        description="File holding an nkey seed (SU...) whose public key the server lists as "
        "a user; the seed never leaves this machine, it signs the server's challenge.",
    )
    user: str | None = Field(
        default=None,
        validation_alias="nats_user",
        description="NATS user name; needs --nats-password.",
    )
    password: SecretStr | None = Field(
        default=None,
        validation_alias="nats_password",
        description="Password of --nats-user; never logged. Prefer the variable to the flag, "
        "which other users of the machine can read in its process list.",
    )
    token: SecretStr | None = Field(
        default=None,
        validation_alias="nats_token",
        description="NATS authentication token (authorization { token: ... }); never logged.",
    )

    @model_validator(mode="after")
    def _pairs(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(f"{self.named('tls_cert')} and {self.named('tls_key')} go together")
        if (self.user is None) != (self.password is None):
            raise ValueError(f"{self.named('user')} and {self.named('password')} go together")
        return self

    @property
    def way_in(self) -> str | None:
        """How this client authenticates: the first of creds, nkey_seed, user (with its
        password) and token that is set, as nats-py itself would prefer them."""
        return next((f for f in WAYS_IN if getattr(self, f) is not None), None)

    @classmethod
    def named(cls, field: str) -> str:
        return setting(cls, field)

    @property
    def tls(self) -> bool:
        """TLS is asked for: every connection must be encrypted."""
        return any(v is not None for v in (self.tls_ca, self.tls_cert, self.tls_server_name))

    def tls_files(self) -> TlsFiles:
        return TlsFiles(
            self.tls_ca,
            self.tls_cert,
            self.tls_key,
            self.named("tls_ca"),
            self.named("tls_cert"),
            self.named("tls_key"),
            self.named("tls_server_name"),
        )

    def refusal(self, exc: BaseException, url: str) -> LinkRefused | None:
        """What ``exc``, met connecting to ``url``, says to fix; None when it is no refusal
        of the link's security (the server is down: reconnecting is the answer)."""
        server = f"the NATS server at {redacted(url)}"
        text = str(exc)
        if NO_TLS in text:
            return self.unencrypted(url)
        if not any(refused in text.lower() for refused in AUTHORIZATION_REFUSED):
            return self.tls_files().refusal(exc, server)
        fix = {
            "creds": f"check the credentials file {self.creds} of {self.named('creds')}",
            "nkey_seed": f"is the public key of {self.named('nkey_seed')} a user of the server?",
            "user": f"check {self.named('user')} and {self.named('password')}",
            "token": f"check {self.named('token')}",
            None: "it requires credentials: give " + " or ".join(map(self.named, WAYS_IN)),
        }[self.way_in]
        return LinkRefused(f"{server} refused to authorize this client ({text}): {fix}")

    def unencrypted(self, url: str) -> LinkRefused:
        return LinkRefused(
            f"the NATS server at {redacted(url)} offers no TLS, yet {self.named('tls_ca')} "
            "(or another --nats-tls-* setting) is set: give the address of its TLS port"
        )


def servers(url: str) -> list[str]:
    """The comma-separated server URLs of one setting, as the client takes them: any one
    that answers is enough to connect, and it then learns the rest of the cluster."""
    return [part.strip() for part in url.split(",") if part.strip()]


def redacted(url: str) -> str:
    """The server URLs without the user or password a URL may carry."""
    shown = []
    for part in url.split(","):
        scheme, sep, rest = part.strip().rpartition("://")
        shown.append(f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}")
    return ",".join(shown)


async def open_connection(url: str, security: NatsSecurity, **options: Any) -> Client:
    """``nats.connect(url, **options)`` with ``security`` applied. Its first connection
    fails at once with ``LinkRefused`` when the server refuses the link's security (the
    client is then closed); other errors, and every error once connected, go to
    ``options['error_cb']``, or are logged as nats-py logs them."""
    from nats.aio.client import Client  # here, not above: the settings import this module

    nc = Client()
    opening = _Opening(nc, url, security, options.pop("error_cb", None))
    credentials = opening.credentials()  # TLS files read: one unreadable fails here
    try:
        await nc.connect(servers(url), error_cb=opening.on_error, **credentials, **options)
        if security.tls and not opening.encrypted():  # nkeys and creds: no secret went out
            raise security.unencrypted(url)
    except LinkRefused:
        # Bounded: after a failed TLS handshake nats-py's close waits forever on the
        # stream it replaced (whose socket is closed by then).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_AFTER_REFUSAL_S):
                await nc.close()
        raise
    opening.connected = True
    return nc


class _Opening:
    """One connection's error callback and credentials: a refusal ends its first
    connection; a password or token goes only over TLS when TLS is set."""

    def __init__(
        self,
        nc: Client,
        url: str,
        security: NatsSecurity,
        later: Callable[[Exception], Awaitable[None]] | None,
    ) -> None:
        self.nc, self.url, self.security, self.later = nc, url, security, later
        self.connected = False

    def encrypted(self) -> bool:
        # nats-py upgrades to TLS exactly when the server's INFO requires it, and goes on
        # in plaintext otherwise, whatever TLS context it was given.
        return bool(self.nc._server_info.get("tls_required"))

    async def on_error(self, exc: Exception) -> None:
        refused = None if self.connected else self.security.refusal(exc, self.url)
        if refused is not None:
            raise refused from exc
        if self.later is not None:
            await self.later(exc)
        else:
            log.error("nats: encountered error", exc_info=exc)

    def credentials(self) -> dict[str, Any]:
        """nats.connect's TLS and credential arguments: the one way in, no other."""
        security, way = self.security, self.security.way_in
        given = {
            "user_credentials": str(security.creds) if way == "creds" else None,
            "nkeys_seed": str(security.nkey_seed) if way == "nkey_seed" else None,
            "user": security.user if way == "user" else None,
            "password": self._over_tls(security.password) if way == "user" else None,
            "token": self._over_tls(security.token) if way == "token" else None,
        }
        tls = security.tls_files().context() if security.tls else None
        return {"tls": tls, "tls_hostname": security.tls_server_name, **given}

    def _over_tls(self, secret: SecretStr | None) -> Callable[[], str] | None:
        """The secret as nats-py asks for it while it writes CONNECT, once the server's
        INFO has said whether the link is encrypted: never in plaintext with TLS set."""
        if secret is None:
            return None

        def give() -> str:
            if self.security.tls and not self.encrypted():
                import nats.errors

                raise nats.errors.Error(NO_TLS)  # a failed attempt: on_error names it
            return secret.get_secret_value()

        return give
