"""Tenants: who a caller is, from its API key (server.api_key, api_keys, api_keys_file, operator_key).

A tenant owns the requests, files and batches it creates: another tenant's id answers 404 (its
existence is not revealed), lists show only its own, and under `loose` its prompts are cached for
itself alone (kev/engine/kv/prefix_store.py). The operator key sees what spans tenants: /metrics,
/v1/stats and the full /v1/channels view. Keys are read once, at start-up; a key that cannot be
read is an error naming where it should have come from; so are an empty key, one that is not printable ASCII
(it could never match a header), and an api_keys_file others may read (as ssh refuses a loose key). An open
server (no key) is either said to be one (server.auth: none, --no-auth) or the default when no key is configured
anywhere. See docs/security.md.
"""
from __future__ import annotations

import hmac
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection

from kev.config.server_config import DEFAULT_TENANT, TENANT_NAME, KeySource, ServerConfig
from kev.errors import KevError

OPERATOR = "operator"  # the operator key's own tenant (its requests are its own, like any tenant's)


@dataclass(frozen=True)
class Caller:
    tenant: str
    is_operator: bool  # may read what spans tenants


class Tenants:
    def __init__(self, keys: dict[str, str], operator_key: str | None = None) -> None:
        """keys: tenant -> key. No key at all: an open server, every caller the one tenant and the operator."""
        seen: dict[str, str] = {}
        for tenant, key in [*keys.items(), *([(OPERATOR, operator_key)] if operator_key else [])]:
            if not is_printable_ascii(key):  # a header carries latin-1 bytes: such a key could never match
                raise KevError(f"the key of tenant {tenant!r} holds characters other than printable ASCII "
                               "(letters, digits, punctuation)")
            if key in seen:
                raise KevError(f"server.api_keys: tenants {seen[key]!r} and {tenant!r} have the same key")
            seen[key] = tenant
        self._keys = [(key.encode(), tenant) for key, tenant in seen.items()]
        self.has_operator_key = operator_key is not None
        # Without an operator key, a lone tenant has nobody to be kept from: it sees the operator's views too.
        self._sole = next(iter(keys)) if len(keys) == 1 and operator_key is None else None
        self.tenant_names = sorted(keys)

    @property
    def is_open(self) -> bool:
        return not self._keys

    def caller(self, authorization: str) -> Caller | None:
        """The caller an Authorization header names ('Bearer KEY'), or None (no key, or a wrong one)."""
        if self.is_open:
            return Caller(DEFAULT_TENANT, True)
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        given, found = token.strip().encode(), None
        for key, tenant in self._keys:  # every key compared in full: the time taken tells nothing
            if hmac.compare_digest(given, key):
                found = tenant
        if found is None:
            return None
        return Caller(found, found == OPERATOR or found == self._sole)

    def any_key(self) -> str | None:
        """A key that opens the operator's views (the cluster's readiness probe reads /v1/channels)."""
        operator = next((k for k, t in self._keys if t == OPERATOR), None)
        chosen = operator or next((k for k, t in self._keys if t == self._sole), None)
        return chosen.decode() if chosen is not None else None

    @classmethod
    def from_config(cls, server: ServerConfig, api_key: str | None = None, api_key_source: str = "--api-key",
                    no_auth: bool = False) -> Tenants:
        """api_key (the CLI's --api-key / KEV_API_KEY, named by api_key_source) overrides server.api_key: the key of
        tenant "default". no_auth (--no-auth) is server.auth: none: an open server, said to be one."""
        if api_key is not None and not api_key.strip():
            raise KevError(f"{api_key_source}: the key is empty; to serve without keys say --no-auth "
                           "(server.auth: none)")
        if server.api_key is not None and not server.api_key.strip():
            raise KevError("server.api_key: the key is empty or white space; to serve without keys set "
                           "server.auth: none")
        if no_auth or server.auth == "none":
            configured = [name for name, value in (("server.api_key", server.api_key or api_key),
                                                   ("server.api_keys", server.api_keys),
                                                   ("server.api_keys_file", server.api_keys_file),
                                                   ("server.operator_key", server.operator_key)) if value]
            if configured:
                raise KevError(f"{'--no-auth' if no_auth else 'server.auth: none'} serves without keys, but "
                               f"{configured[0]} sets one: choose one")
            return cls({})
        keys = {tenant: read_key(source, f"server.api_keys.{tenant}") for tenant, source in server.api_keys.items()}
        if server.api_keys_file is not None:
            for tenant, key in _read_keys_file(Path(server.api_keys_file).expanduser()).items():
                if tenant in keys:
                    raise KevError(f"server.api_keys_file: tenant {tenant!r} is also in server.api_keys")
                keys[tenant] = key
        single = api_key or server.api_key
        if single:
            single = _checked(single, api_key_source if api_key else "server.api_key")
            if DEFAULT_TENANT in keys:
                raise KevError(f"server.api_key is the key of tenant {DEFAULT_TENANT!r}, which server.api_keys "
                               "also names")
            keys[DEFAULT_TENANT] = single
        operator = read_key(server.operator_key, "server.operator_key") if server.operator_key is not None else None
        if server.auth == "keys" and not keys and operator is None:
            raise KevError("server.auth: keys, but no key is configured (server.api_key, server.api_keys, "
                           "server.api_keys_file, --api-key or $KEV_API_KEY)")
        return cls(keys, operator)


def is_printable_ascii(key: str) -> bool:
    return all(33 <= ord(c) <= 126 for c in key)


def read_key(source: str | KeySource, where: str) -> str:
    if isinstance(source, str):
        key = source
    elif source.env is not None:
        if source.env not in os.environ:
            raise KevError(f"{where}: environment variable {source.env} is not set")
        if not (key := os.environ[source.env]).strip():  # set but empty: said so, as any empty key is
            raise KevError(f"{where}: the key is empty (environment variable {source.env})")
    else:
        path = Path(source.file or "").expanduser()
        try:
            key = (path.read_text().strip().splitlines() or [""])[0]
        except OSError as err:
            raise KevError(f"{where}: cannot read {path}: {err.strerror}") from None
    return _checked(key, where)


def _checked(key: str, where: str) -> str:
    key = key.strip()
    if not key or any(c.isspace() for c in key):
        raise KevError(f"{where}: the key is empty or holds white space")
    return key


def _read_keys_file(path: Path) -> dict[str, str]:
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):  # every tenant's key: the owner's alone, as ssh wants its keys
            raise KevError(f"server.api_keys_file: {path} is mode {stat.S_IMODE(mode):04o}, open to group or "
                           f"others; make it 0600 (chmod 600 {path})")
        lines = path.read_text().splitlines()
    except OSError as err:
        raise KevError(f"server.api_keys_file: cannot read {path}: {err.strerror}") from None
    keys: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not (line := line.strip()) or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not TENANT_NAME.match(parts[0]) or parts[0] == OPERATOR or parts[0] in keys:
            raise KevError(f"server.api_keys_file: {path} line {number}: expected 'TENANT KEY' with a new tenant name")
        keys[parts[0]] = parts[1]
    return keys


def caller_of(request: HTTPConnection) -> Caller:
    """The caller the gate found for this request (a route's dependency)."""
    caller = request.scope.get("state", {}).get("caller")
    assert isinstance(caller, Caller), "GateMiddleware sets the caller of every request it lets through"
    return caller


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def open_server_notices(tenants: Tenants, server: ServerConfig, no_auth: bool) -> list[str]:
    """What the start-up log says about an open server: that it is one (and whether on purpose), and a warning
    line when it listens beyond this machine."""
    if not tenants.is_open:
        return []
    explicit = "--no-auth" if no_auth else "server.auth: none" if server.auth == "none" else None
    lines = [f"open server ({explicit}): no API key; every caller is tenant {DEFAULT_TENANT!r} and the operator"
             if explicit else "open server: no API key is configured; every caller is tenant "
                              f"{DEFAULT_TENANT!r} and the operator (say server.auth: none or --no-auth to mean it)"]
    if server.host not in LOOPBACK_HOSTS and not server.host.startswith("127."):
        lines.append(f"WARNING: no API key and server.host {server.host!r} is not loopback: anyone who reaches "
                     f"port {server.port} reads and runs everything (set server.api_keys, or --host 127.0.0.1)")
    return lines
