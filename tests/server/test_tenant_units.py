"""Tenants without a model: keys to callers, typed prefix keys, per-tenant prefix counters, the file store's owners,
quota, expiry and modes, and the gate (every scope type needs the key; an upload streams through)."""
from __future__ import annotations

import asyncio
import io
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import kev
from kev.batch.store import BatchStore, QuotaError, safe_filename
from kev.config.server_config import ServerConfig
from kev.errors import KevError
from kev.engine.kv.block_manager import BlockManager
from kev.engine.kv.prefix_store import PrefixStore, prefix_key
from kev.server.middleware import GateMiddleware
from kev.config.tenants import OPERATOR, Caller, Tenants, open_server_notices


# --- keys -> callers ------------------------------------------------------------------
def test_keys_come_from_yaml_env_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEV_TEST_KEY_B", "key-b")
    (tmp_path / "c.key").write_text("key-c\n")
    (tmp_path / "keys").write_text("# tenant key\nd key-d\n\ne key-e\n")
    (tmp_path / "keys").chmod(0o600)
    monkeypatch.setenv("KEV_TEST_KEY_OP", "key-op")
    server = ServerConfig(api_key="key-default", api_keys={"a": "key-a", "b": {"env": "KEV_TEST_KEY_B"},
                                                          "c": {"file": str(tmp_path / "c.key")}},
                          api_keys_file=str(tmp_path / "keys"), operator_key={"env": "KEV_TEST_KEY_OP"})
    tenants = Tenants.from_config(server)
    for tenant in ("a", "b", "c", "d", "e", "default"):
        assert tenants.caller(f"Bearer key-{tenant}") == Caller(tenant, False)
    assert tenants.caller("Bearer key-op") == Caller(OPERATOR, True)
    for wrong in ("", "Bearer", "Bearer key-", "Basic key-a", "key-a", "Bearer key-ax"):
        assert tenants.caller(wrong) is None, wrong


def test_a_lone_tenant_is_the_operator_and_an_open_server_has_one_caller() -> None:
    assert Tenants.from_config(ServerConfig(api_key="k")).caller("Bearer k") == Caller("default", True)
    assert Tenants.from_config(ServerConfig(), api_key="cli").caller("Bearer cli") == Caller("default", True)
    two = Tenants({"a": "ka", "b": "kb"})
    assert two.caller("Bearer ka") == Caller("a", False), "with two tenants and no operator key, nobody operates"
    assert Tenants({}).caller("") == Caller("default", True)


@pytest.mark.parametrize(("server", "message"), [
    ({"api_keys": {"a": {"env": "KEV_TEST_UNSET_VAR"}}}, "server.api_keys.a: environment variable"),
    ({"api_keys": {"a": {"file": "/nonexistent/key"}}}, "server.api_keys.a: cannot read"),
    ({"api_keys": {"a": "same", "b": "same"}}, "have the same key"),
    ({"api_keys": {"default": "x"}, "api_key": "y"}, "tenant 'default'"),
    ({"api_keys": {"a": "has space"}}, "white space"),
])
def test_keys_that_cannot_be_used_stop_the_start(server: dict[str, Any], message: str) -> None:
    with pytest.raises(KevError, match=message):
        Tenants.from_config(ServerConfig(**server))


@pytest.mark.parametrize(("server", "cli_key", "message"), [
    ({"api_key": "   "}, None, "server.api_key: the key is empty"),
    ({}, "", "--api-key: the key is empty"),
    ({}, " ", "--api-key: the key is empty"),
    ({"api_keys": {"a": "  "}}, None, "server.api_keys.a: the key is empty"),
    ({"api_keys": {"a": {"env": "KEV_TEST_BLANK"}}}, None, "server.api_keys.a: the key is empty"),
    ({"api_keys": {"a": {"env": "KEV_TEST_EMPTY"}}}, None, r"server.api_keys.a: the key is empty \(environment"),
    ({"operator_key": ""}, None, "server.operator_key: the key is empty"),
    ({"api_keys": {"a": "kéy"}}, None, "tenant 'a' holds characters other than printable ASCII"),
    ({"operator_key": "op\u00e9x"}, None, "tenant 'operator' holds characters other than printable ASCII"),
    ({"auth": "keys"}, None, "server.auth: keys, but no key is configured"),
    ({"auth": "none", "api_keys": {"a": "ka"}}, None, "server.auth: none serves without keys, but server.api_keys"),
])
def test_empty_blank_and_non_ascii_keys_stop_the_start_naming_their_source(
        server: dict[str, Any], cli_key: str | None, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEV_TEST_BLANK", " \t")
    monkeypatch.setenv("KEV_TEST_EMPTY", "")
    with pytest.raises(KevError, match=message):
        Tenants.from_config(ServerConfig(**server), cli_key)


def test_an_empty_key_variable_is_named_and_an_open_server_is_said_to_be_one() -> None:
    with pytest.raises(KevError, match=r"\$KEV_API_KEY: the key is empty; to serve without keys say --no-auth"):
        Tenants.from_config(ServerConfig(), "", "$KEV_API_KEY")
    with pytest.raises(KevError, match="--no-auth serves without keys, but server.api_key"):
        Tenants.from_config(ServerConfig(), "k", no_auth=True)
    explicit = Tenants.from_config(ServerConfig(auth="none"))
    assert explicit.is_open and explicit.caller("") == Caller("default", True)
    lines = open_server_notices(explicit, ServerConfig(auth="none"), False)
    assert lines == ["open server (server.auth: none): no API key; every caller is tenant 'default' and the operator"]
    wide = ServerConfig(host="0.0.0.0")
    lines = open_server_notices(Tenants.from_config(wide), wide, True)
    assert "(--no-auth)" in lines[0] and lines[1].startswith("WARNING: no API key and server.host '0.0.0.0'")
    lines = open_server_notices(Tenants.from_config(wide), wide, False)  # auto, no key anywhere: open, said so
    assert "say server.auth: none or --no-auth to mean it" in lines[0] and lines[1].startswith("WARNING: no API key")
    assert open_server_notices(Tenants({"a": "ka"}), wide, False) == [], "keys: nothing to warn about"
    assert len(open_server_notices(Tenants({}), ServerConfig(host="127.0.0.2"), False)) == 1, "loopback: no warning"


def test_a_keys_file_others_may_read_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("d key-d\n")
    for mode in (0o644, 0o640, 0o604, 0o660):
        keys.chmod(mode)
        with pytest.raises(KevError, match=f"server.api_keys_file: .* is mode {mode:04o}, open to group or others"):
            Tenants.from_config(ServerConfig(api_keys_file=str(keys)))
    keys.chmod(0o400)
    assert Tenants.from_config(ServerConfig(api_keys_file=str(keys))).caller("Bearer key-d") == Caller("d", True)


@pytest.mark.parametrize("name", ["operator", "", "a b", "../x", "x" * 65])
def test_tenant_names_are_checked_at_load(name: str) -> None:
    with pytest.raises(ValueError, match="server.api_keys"):
        kev.load_config({"server": {"api_keys": {name: "k"}}})


# --- the prefix cache -----------------------------------------------------------------
def test_prefix_keys_are_typed_so_tenants_and_public_never_collide() -> None:
    ids = [1, 2, 3]
    public = prefix_key("loose", ids, "r1", "a", is_public=True)
    assert public == prefix_key("loose", ids, "r2", "b", is_public=True), "the operator's prefix: one for everyone"
    a, b = prefix_key("loose", ids, "r1", "a", False), prefix_key("loose", ids, "r2", "b", False)
    assert len({public, a, b, prefix_key("loose", ids, "r", "public", False)}) == 4
    assert a == prefix_key("loose", ids, "r9", "a", False), "a tenant's own prefix is reused by the tenant"
    assert prefix_key("strict", ids, "r1", "a", True) != prefix_key("strict", ids, "r2", "a", True)
    assert prefix_key("shared", ids, "r1", "a", True).scope == "request"


def test_prefix_counters_are_per_tenant() -> None:
    blocks = BlockManager(64, 4)
    store = PrefixStore(blocks)
    ids = list(range(10))
    for tenant in ("a", "a", "b"):
        store.acquire(prefix_key("loose", ids, "r", tenant, False), ids, "loose", tenant)
    store.acquire(prefix_key("strict", ids, "r", "b", False), ids, "strict", "b")
    assert store.loose_counts == {"a": [2, 1], "b": [1, 0]}, "b's lookup of a's prefix is b's own miss"
    assert (store.num_loose_queries, store.num_loose_hits) == (3, 1)


# --- files ------------------------------------------------------------------------------
def test_files_belong_to_their_tenant_and_are_private_on_disk(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b")
    meta = store.add_file(io.BytesIO(b'{"x": 1}\n' * 1000), "../../etc/pa\r\nss\"wd.jsonl", "batch", "a", 1 << 20)
    assert meta["filename"] == "pa__ss_wd.jsonl" and meta["bytes"] == 9000
    assert store.file(meta["id"], "a") is not None and store.file(meta["id"], "b") is None
    assert [f["id"] for f in store.files("a")] == [meta["id"]] and store.files("b") == []
    for path in (store.data_path(meta["id"]), store.files_dir / f"{meta['id']}.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(store.files_dir.stat().st_mode) == 0o700
    assert len(meta["id"]) == len("file-") + 24 and len({store.new_file_id() for _ in range(1000)}) == 1000


def test_quota_size_limit_and_expiry(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    store.add_file(io.BytesIO(b"x" * 600), "one", "batch", "a", 1000, quota_bytes=1000)
    with pytest.raises(QuotaError, match="batch.tenant_quota_bytes=1000"):
        store.add_file(io.BytesIO(b"x" * 600), "two", "batch", "a", 1000, quota_bytes=1000)
    store.add_file(io.BytesIO(b"x" * 600), "two", "batch", "b", 1000, quota_bytes=1000)  # b's quota is b's own
    with pytest.raises(ValueError, match="batch.max_file_bytes=1000"):
        store.add_file(io.BytesIO(b"x" * 1001), "big", "batch", "c", 1000)
    assert len(list(store.files_dir.iterdir())) == 4, "a refused upload leaves nothing behind"
    meta = store.add_file(io.BytesIO(b"x"), "short", "batch", "c", 1000, expires_after_s=3600)
    assert meta["expires_at"] == pytest.approx(time.time() + 3600, abs=5)
    meta["expires_at"] = int(time.time()) - 1
    (store.files_dir / f"{meta['id']}.json").write_text(json.dumps(meta))
    assert store.file(meta["id"], "c") is None and not store.data_path(meta["id"]).exists(), "expired: deleted"


@pytest.mark.parametrize(("name", "safe"), [("a.jsonl", "a.jsonl"), ("C:\\x\\y.jsonl", "y.jsonl"),
                                            ("..", "upload.jsonl"), ("名前.jsonl", "名前.jsonl"),
                                            ("a;b=c\"\n.jsonl", "a_b_c__.jsonl")])
def test_filenames_are_sanitised(name: str, safe: str) -> None:
    assert safe_filename(name) == safe


# --- the gate ---------------------------------------------------------------------------
class Recorder:
    """The app behind the gate: records the scopes that reach it and reads the whole body."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.bodies: list[int] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        if scope["type"] != "http":
            return
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionError("client gone")
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        self.bodies.append(size)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def run_gate(gate: GateMiddleware, scope: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(gate(scope, receive, send))
    return sent


def scope_of(kind: str, path: str, key: str | None, method: str = "GET") -> dict[str, Any]:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    return {"type": kind, "path": path, "method": method, "headers": headers}


def test_every_scope_type_needs_the_key() -> None:
    app = Recorder()
    gate = GateMiddleware(app, Tenants({"a": "ka"}), max_body_bytes=1024)  # type: ignore[arg-type]
    sent = run_gate(gate, scope_of("websocket", "/v1/anything", None), [{"type": "websocket.connect"}])
    assert sent == [{"type": "websocket.close", "code": 1008, "reason": "missing or wrong API key"}]
    assert run_gate(gate, scope_of("webtransport", "/x", "wrong"), []) == [] and app.scopes == []
    run_gate(gate, scope_of("websocket", "/v1/anything", "ka"), [])
    assert app.scopes[-1]["state"]["caller"] == Caller("a", True)
    run_gate(gate, {"type": "lifespan"}, [])
    assert app.scopes[-1]["type"] == "lifespan", "the server's own start and stop pass"


def test_an_upload_streams_through_and_is_cut_at_its_limit() -> None:
    app = Recorder()
    gate = GateMiddleware(app, Tenants({"a": "ka"}), max_body_bytes=64,  # type: ignore[arg-type]
                          path_limits={"/v1/files": (100 << 10, "batch.max_file_bytes")})
    chunk = {"type": "http.request", "body": b"x" * (32 << 10), "more_body": True}
    sent = run_gate(gate, scope_of("http", "/v1/files", "ka", "POST"), [chunk] * 3 + [{"type": "http.request"}])
    assert sent[0]["status"] == 200 and app.bodies == [96 << 10], "a body over max_body_bytes, under the upload limit"
    sent = run_gate(gate, scope_of("http", "/v1/files", "ka", "POST"), [chunk] * 8)
    assert sent[0]["status"] == 413 and b"batch.max_file_bytes" in sent[1]["body"]
    assert len(sent) == 2, "the route's own answer to the cut body never reaches the client"


def test_uploaded_and_audit_files_are_written_0600(tmp_path: Path) -> None:
    from kev.batch.output_file import OutputFile
    from kev.engine.kv.audit import AuditLog

    (tmp_path / "old.jsonl").write_text("")
    os.chmod(tmp_path / "old.jsonl", 0o644)
    AuditLog(str(tmp_path / "old.jsonl"), "summary").write("step")
    OutputFile(tmp_path / "out.jsonl").close()
    for name in ("old.jsonl", "out.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    AuditLog(str(tmp_path / "new" / "deeper" / "audit.jsonl"), "summary")
    for folder in (tmp_path / "new", tmp_path / "new" / "deeper"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_two_authorization_headers_are_a_400_whichever_is_right() -> None:
    app = Recorder()
    gate = GateMiddleware(app, Tenants({"a": "ka", "b": "kb"}), max_body_bytes=1024)  # type: ignore[arg-type]
    for pair in (("ka", "kb"), ("ka", "wrong"), ("wrong", "ka")):
        scope = {**scope_of("http", "/v1/channels", None), "headers": [
            (b"authorization", f"Bearer {pair[0]}".encode()), (b"Authorization", f"Bearer {pair[1]}".encode())]}
        sent = run_gate(gate, scope, [])
        assert sent[0]["status"] == 400 and b'"field":"Authorization"' in sent[1]["body"].replace(b" ", b""), pair
    assert app.scopes == [], "nothing of the app ran"
    run_gate(gate, scope_of("http", "/v1/channels", "kb"), [{"type": "http.request"}])
    assert app.scopes[-1]["state"]["caller"] == Caller("b", False)
