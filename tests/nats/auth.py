"""NATS identities made in the test: an nkey user (its seed file and the public key the
server lists), and operator mode (an operator, a system account and an account with
JetStream, signed as `nsc` signs them) with a user's .creds file. The JWTs are the
nats-server's own format: header.claims.signature, base64url without padding, each
signed by its issuer's nkey."""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys

UNLIMITED = ("subs", "data", "payload", "imports", "exports", "conn", "leaf")
JETSTREAM = ("mem_storage", "disk_storage", "streams", "consumer")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _keypair(prefix: int) -> tuple[bytes, nkeys.KeyPair]:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed, nkeys.from_seed(bytearray(seed))


def _public(pair: nkeys.KeyPair) -> str:
    return str(pair.public_key.decode())


def _jwt(issuer: nkeys.KeyPair, subject: str, name: str, claims: dict[str, object]) -> str:
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = {
        "jti": _b64(os.urandom(16)).upper(),
        "iat": int(time.time()),
        "iss": _public(issuer),
        "name": name,
        "sub": subject,
        "nats": {**claims, "version": 2},
    }
    payload = _b64(json.dumps(body).encode())
    signature = _b64(issuer.sign(f"{header}.{payload}".encode()))
    return f"{header}.{payload}.{signature}"


@dataclass(frozen=True)
class NkeyUser:
    seed_file: Path
    public_key: str


def nkey_user(folder: Path, name: str = "nkey-user") -> NkeyUser:
    seed, pair = _keypair(nkeys.PREFIX_BYTE_USER)
    path = folder / f"{name}.nk"
    path.write_bytes(seed + b"\n")
    path.chmod(0o600)
    return NkeyUser(path, _public(pair))


@dataclass(frozen=True)
class OperatorMode:
    config: str  # the server's operator, system account and preloaded accounts
    creds: Path  # a user of the JetStream account
    stranger_creds: Path  # a user signed by an account the server does not know


def operator_mode(folder: Path) -> OperatorMode:
    _, operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    _, system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    _, account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    _, stranger = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    limits = {name: -1 for name in UNLIMITED} | {"wildcards": True}
    operator_jwt = _jwt(
        operator, _public(operator), "op", {"type": "operator", "system_account": _public(system)}
    )
    system_jwt = _jwt(operator, _public(system), "SYS", {"limits": limits, "type": "account"})
    account_claims = {
        "limits": limits | {name: -1 for name in JETSTREAM},
        "default_permissions": {"pub": {}, "sub": {}},
        "type": "account",
    }
    account_jwt = _jwt(operator, _public(account), "flotilla", account_claims)
    config = (
        f'operator: "{operator_jwt}"\n'
        f"system_account: {_public(system)}\n"
        "resolver: MEMORY\n"
        f'resolver_preload: {{ {_public(system)}: "{system_jwt}", '
        f'{_public(account)}: "{account_jwt}" }}\n'
    )
    return OperatorMode(
        config, _creds(folder / "user.creds", account), _creds(folder / "stranger.creds", stranger)
    )


def _creds(path: Path, account: nkeys.KeyPair) -> Path:
    seed, user = _keypair(nkeys.PREFIX_BYTE_USER)
    claims = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user"}
    user_jwt = _jwt(account, _public(user), "worker", claims)
    path.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed.decode()}\n------END USER NKEY SEED------\n"
    )
    path.chmod(0o600)
    return path
