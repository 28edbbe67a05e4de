"""TLS for the links flotilla opens to its servers (NATS, Kafka): the client's SSL context
from the CA, certificate and key files its settings name, and what a failed handshake
means. Both links go through ``TlsFiles``, so they verify alike (the server's
certificate against the CA, its name against the address) and fail alike: a
``LinkRefused`` that names the setting to fix. Light: the settings import it."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from embedder.core.errors import LinkRefused

# Alerts a server sends when it wants a client certificate, or distrusts the one it got.
CLIENT_CERTIFICATE_REFUSED = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
    }
)


def setting(model: type[BaseModel], field: str) -> str:
    """A settings section's field as its user gives it: the flag and the variable, both
    named by the field's alias (as ``flotilla.settings`` names them)."""
    alias = model.model_fields[field].validation_alias
    name = alias if isinstance(alias, str) else field
    return f"--{name.replace('_', '-')} (FLOTILLA_{name.upper()})"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A link's TLS files, each with the setting that names it, for the messages."""

    ca: Path | None
    cert: Path | None
    key: Path | None
    ca_setting: str
    cert_setting: str
    key_setting: str
    server_name_setting: str | None = None  # the link's, if it can verify another name

    def context(self) -> ssl.SSLContext:
        """Verifies the server against ``ca`` (the system's CAs when unset) and its name;
        presents ``cert`` and ``key`` when set."""
        try:
            context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        except OSError as exc:  # ssl.SSLError too: a file that holds no certificate
            raise LinkRefused(
                f"cannot read the CA file {self.ca} of {self.ca_setting}: {_reason(exc)}"
            ) from exc
        if self.cert is not None:
            try:
                context.load_cert_chain(self.cert, self.key)
            except OSError as exc:
                raise LinkRefused(
                    f"cannot load the client certificate {self.cert} ({self.cert_setting}) "
                    f"with its key {self.key} ({self.key_setting}): {_reason(exc)}"
                ) from exc
        return context

    def refusal(self, exc: BaseException, server: str) -> LinkRefused | None:
        """``exc``, met while connecting to ``server``, as the TLS setting to fix; None if
        it is no TLS failure, or one a retry may get past (a connection cut mid-way)."""
        if isinstance(exc, ssl.SSLCertVerificationError):
            message = exc.verify_message or _reason(exc)
            fix = f"check {self.ca_setting}, the CA that signed the server's certificate"
            if "mismatch" in message and self.server_name_setting:
                fix = (
                    f"connect by a name the certificate holds, or give it with "
                    f"{self.server_name_setting}"
                )
            return LinkRefused(f"TLS verification of {server} failed ({message}): {fix}")
        if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return None
        if isinstance(exc, ssl.SSLError):
            reason = exc.reason or _reason(exc)
            if reason in CLIENT_CERTIFICATE_REFUSED:
                return LinkRefused(
                    f"{server} refused this client's TLS certificate ({reason}): check "
                    f"{self.cert_setting} and {self.key_setting}, a certificate its CA signed"
                )
            return LinkRefused(
                f"the TLS handshake with {server} failed ({reason}): check that the server "
                f"speaks TLS there, and {self.ca_setting}"
            )
        return None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
