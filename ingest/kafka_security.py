"""How flotilla's Kafka clients are secured: TLS (SSL), SASL (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512), or SASL over TLS (SASL_SSL, what managed Kafka requires), in aiokafka's
own terms. ``flotilla.settings`` holds ``KafkaSecurity`` as its ``kafka_security``
section, each field a setting named by its alias; ``ingest.kafka_clients`` applies it
to every client. Light, like ``ingest.config``: no Kafka client loads with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from embedder.core.tls import TlsFiles, setting

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


class KafkaSecurity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True)

    security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT",
        validation_alias="kafka_security_protocol",
        description="How the Kafka clients reach the brokers: PLAINTEXT; SSL (TLS, the "
        "brokers verified against --kafka-tls-ca); SASL_SSL (a user and password over TLS, "
        "what managed Kafka asks for); SASL_PLAINTEXT (the same unencrypted: PLAIN then "
        "sends the password in the clear).",
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        default="PLAIN",
        validation_alias="kafka_sasl_mechanism",
        description="SASL mechanism of SASL_SSL or SASL_PLAINTEXT: PLAIN hands the password "
        "to the broker; SCRAM proves it without sending it (the broker holds it salted).",
    )
    sasl_username: str | None = Field(
        default=None,
        validation_alias="kafka_sasl_username",
        description="SASL user name (the API key of a managed cluster).",
    )
    sasl_password: SecretStr | None = Field(
        default=None,
        validation_alias="kafka_sasl_password",
        description="SASL password (the API secret); never logged. Prefer the variable to "
        "the flag, which other users of the machine can read in its process list.",
    )
    tls_ca: Path | None = Field(
        default=None,
        validation_alias="kafka_tls_ca",
        description="CA file (PEM) the brokers' certificates are verified against, with SSL "
        "or SASL_SSL; the system's CAs when unset (a managed cluster's public certificate).",
    )
    tls_cert: Path | None = Field(
        default=None,
        validation_alias="kafka_tls_cert",
        description="Client certificate (PEM) for brokers that authenticate clients by TLS "
        "(ssl.client.auth=required); needs --kafka-tls-key.",
    )
    tls_key: Path | None = Field(
        default=None,
        validation_alias="kafka_tls_key",
        description="Private key (PEM) of --kafka-tls-cert.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        protocol = self.named("security_protocol")
        sasl = self.security_protocol.startswith("SASL_")
        login = (self.sasl_username, self.sasl_password)
        if sasl and None in login:
            raise ValueError(
                f"{protocol} {self.security_protocol} needs {self.named('sasl_username')} and "
                f"{self.named('sasl_password')}"
            )
        if not sasl and login != (None, None):
            raise ValueError(f"a SASL user and password need {protocol} SASL_SSL")
        files = ("tls_ca", "tls_cert", "tls_key")
        if not self.tls and any(getattr(self, f) is not None for f in files):
            raise ValueError(f"the --kafka-tls-* files need {protocol} SSL or SASL_SSL")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(f"{self.named('tls_cert')} and {self.named('tls_key')} go together")
        return self

    @classmethod
    def named(cls, field: str) -> str:
        return setting(cls, field)

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def tls_files(self) -> TlsFiles:
        return TlsFiles(
            self.tls_ca,
            self.tls_cert,
            self.tls_key,
            self.named("tls_ca"),
            self.named("tls_cert"),
            self.named("tls_key"),
        )

    def client_options(self) -> dict[str, Any]:
        """The keyword arguments every aiokafka client takes for this security. Reads the
        TLS files: ``LinkRefused`` names the setting of one it cannot read."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.tls:
            options["ssl_context"] = self.tls_files().context()
        if self.sasl_password is not None:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return options
