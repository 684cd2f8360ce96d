"""Callers as isolated as questions, on a real `kev serve` with three tenants and an operator key (docs/security.md):
another tenant's requests, files and batches are 404s, /v1/channels counts them but names none of their channels,
the operator's routes are the operator's, a probe of another tenant's prompt moves nothing the prober can read, and
DELETE on a request in flight answers 200 whatever route it came by."""
from __future__ import annotations

import json
import re
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ServerProcess, metric, read_sse, wait_until

pytestmark = pytest.mark.service

KEYS = {"alice": "key-alice", "bob": "key-bob", "operator": "key-operator", "default": "key-default"}
PUBLIC = "You are a helpful assistant."
SECRET = "Internal notes. The vault PIN is 4417. " + "Clause. " * 40
LONG = {"prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 400}
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "bob.key").write_text(KEYS["bob"] + "\n")
    audit = secrets / "audit" / "audit.jsonl"  # a folder Kev makes: 0700
    config = {"server": {"api_keys": {"alice": KEYS["alice"], "bob": {"file": str(secrets / "bob.key")}},
                         "operator_key": KEYS["operator"]},
              "isolation": {"level": "loose", "kv_cache": "shared_readonly", "system_prompt": PUBLIC},
              "router": {"default_max_tokens": 4, "default_timeout_ms": 300_000},
              "audit": {"path": str(audit), "level": "full"}}
    return start_server(config, api_key=KEYS["default"])


@pytest.fixture(scope="module")
def as_(server: ServerProcess) -> Iterator[dict[str, httpx.Client]]:
    clients = {name: httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=300)
               for name, key in KEYS.items()}
    yield clients
    for client in clients.values():
        client.close()


def test_another_tenants_request_is_unknown(as_: dict[str, httpx.Client]) -> None:
    accepted = as_["alice"].post("/v1/requests", json={"queries": ["Say hi."]})
    request_id = accepted.json()["request_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id), "128 random bits"
    for name in ("bob", "operator", "default"):
        for method in ("GET", "DELETE"):
            response = as_[name].request(method, f"/v1/requests/{request_id}")
            assert response.status_code == 404 and response.json()["error"]["field"] == "request_id", name
    made_up = as_["bob"].get(f"/v1/requests/{'0' * 32}")
    assert made_up.status_code == 404 and made_up.json()["error"]["message"].replace("0" * 32, request_id) == \
        as_["bob"].get(f"/v1/requests/{request_id}").json()["error"]["message"], "the same answer as a made-up id"
    done = wait_until(lambda: (r := as_["alice"].get(f"/v1/requests/{request_id}").json())["status"] == "done" and r)
    assert done["results"][0]["status"] == "ok"


def test_channels_count_other_tenants_but_name_none_of_their_channels(as_: dict[str, httpx.Client]) -> None:
    with as_["alice"].stream("POST", "/v1/query", json={"queries": [LONG], "stream": True}) as response:
        request_id = response.headers["X-Request-Id"]
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("event:")) == "event: delta"
        mine = [c for c in as_["alice"].get("/v1/channels").json()["channels"] if c["request_id"] == request_id]
        assert mine and mine[0]["tokens"] > 0
        bobs = as_["bob"].get("/v1/channels").json()
        # no channel id at all, not even an idle one's (the busy ones would be the rest): only how many are busy
        assert bobs["channels"] == [] and bobs["num_busy_other_tenants"] >= 1 and bobs["num_active"] >= 1, bobs
        assert request_id not in as_["bob"].get("/v1/channels").text
        full = as_["operator"].get("/v1/channels").json()["channels"]
        assert any(c["request_id"] == request_id for c in full), "the operator sees every channel"
        assert as_["alice"].delete(f"/v1/requests/{request_id}").status_code == 200


def test_the_operators_routes_are_the_operators(as_: dict[str, httpx.Client]) -> None:
    for name in ("alice", "bob", "default"):
        for path in ("/metrics", "/v1/stats"):
            response = as_[name].get(path)
            assert response.status_code == 403 and "server.operator_key" in response.text, (name, path)
    assert as_["operator"].get("/metrics").status_code == as_["operator"].get("/v1/stats").status_code == 200


def counters(as_: dict[str, httpx.Client], tenant: str) -> tuple[float, float]:
    text = as_["operator"].get("/metrics").text
    return (metric(text, "kev_prefix_cache_tenant_queries_total", tenant=tenant),
            metric(text, "kev_prefix_cache_tenant_hits_total", tenant=tenant))


def seen_by_bob(as_: dict[str, httpx.Client]) -> list[Any]:
    """Everything bob can read that is not his own answer: the routes that could count anything."""
    wait_until(lambda: as_["bob"].get("/v1/channels").json()["num_active"] == 0)
    return [as_["bob"].get(path).status_code for path in ("/metrics", "/v1/stats")] + [
        as_["bob"].get("/v1/channels").json()["channels"], as_["bob"].get("/v1/files").json(),
        as_["bob"].get("/v1/batches").json()["data"]]


def test_a_probe_of_another_tenants_prompt_is_a_miss_that_moves_nothing_bob_reads(
        as_: dict[str, httpx.Client]) -> None:
    question = {"queries": [[{"role": "user", "content": "Say OK."}]], "system": SECRET, "isolation": "loose"}
    alice, bob = counters(as_, "alice"), counters(as_, "bob")
    for _ in range(2):  # alice's own repeat hits her cache
        assert as_["alice"].post("/v1/query", json=question).status_code == 200
    assert counters(as_, "alice") == (alice[0] + 2, alice[1] + 1)
    before = seen_by_bob(as_)
    probe = as_["bob"].post("/v1/query", json=question).json()["results"][0]
    after_probe = seen_by_bob(as_)
    decoy = as_["bob"].post("/v1/query", json={**question, "system": SECRET.replace("4417", "9052")})
    assert probe["status"] == decoy.json()["results"][0]["status"] == "ok"
    assert before == after_probe == seen_by_bob(as_), "the right guess and the decoy leave bob's view alike"
    assert counters(as_, "bob") == (bob[0] + 2, bob[1]), "bob's probe was a miss"


def test_delete_in_flight_answers_200_on_every_route(as_: dict[str, httpx.Client]) -> None:
    alice = as_["alice"]
    # a stream of the Kev API, then of the OpenAI one (its id: chatcmpl-<request_id>)
    with alice.stream("POST", "/v1/query", json={"queries": [LONG], "stream": True}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("event:")) == "event: delta"
        cancel = alice.delete(f"/v1/requests/{response.headers['X-Request-Id']}")
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled", cancel.text
        events = read_sse(lines)
    assert [e for e, data in events if e == "result" and data["status"] == "cancelled"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Count to 500."}], "max_tokens": 400,
            "ignore_eos": True, "stream": True}
    with alice.stream("POST", "/v1/chat/completions", json=chat) as response:
        lines = response.iter_lines()  # held: a dropped iterator closes the connection, which cancels as well
        first = json.loads(next(line for line in lines if line.startswith("data:"))[5:])
        cancel = alice.delete(f"/v1/requests/{first['id']}")
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled", cancel.text
        assert '"finish_reason": "cancelled"' in "".join(lines)
    # a call that waits for its whole answer: its id from /v1/channels, the caller's own
    answer: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: answer.append(alice.post("/v1/query", json={"queries": [LONG]})))
    waiting.start()
    request_id = wait_until(lambda: next((c["request_id"] for c in alice.get("/v1/channels").json()["channels"]
                                          if c["request_id"]), None))
    cancel = alice.delete(f"/v1/requests/{request_id}")
    waiting.join(300)
    assert cancel.status_code == 200, cancel.text
    assert answer[0].status_code == 200 and answer[0].json()["results"][0]["status"] == "cancelled"


def test_files_and_batches_are_their_tenants(as_: dict[str, httpx.Client], server: ServerProcess) -> None:
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "' + \
        MODEL.encode() + b'", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}}\n'
    upload = as_["alice"].post("/v1/files", data={"purpose": "batch", "expires_after[anchor]": "created_at",
                                                  "expires_after[seconds]": "3600"},
                               files={"file": ('..\\evil"\r\nX-Injected: 1.jsonl', line)})
    assert upload.status_code == 200, upload.text
    meta = upload.json()
    assert re.fullmatch(r"[\w.\- ]+", meta["filename"]) and meta["filename"].startswith("evil"), meta["filename"]
    assert meta["expires_at"] - meta["created_at"] == 3600
    assert "kev" not in meta
    file_id = meta["id"]
    batch = as_["alice"].post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                   "completion_window": "24h"}).json()
    bob = as_["bob"]
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content", f"/v1/batches/{batch['id']}"):
        assert bob.get(path).status_code == 404, path
    assert bob.delete(f"/v1/files/{file_id}").status_code == 404
    assert bob.post(f"/v1/batches/{batch['id']}/cancel").status_code == 404
    assert bob.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"}).status_code == 404
    assert bob.get("/v1/files").json()["data"] == [] and bob.get("/v1/batches").json()["data"] == []
    content = as_["alice"].get(f"/v1/files/{file_id}/content")
    assert content.content == line and "\r" not in content.headers["content-disposition"]
    done = wait_until(lambda: (b := as_["alice"].get(f"/v1/batches/{batch['id']}").json())["status"] == "completed"
                      and b)
    folder = server.workdir / "batches" / "files"
    for file in [folder / f"{file_id}.data", folder / f"{done['output_file_id']}.data"]:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    audit = Path(server.config["audit"]["path"])
    assert stat.S_IMODE(audit.stat().st_mode) == 0o600
    assert stat.S_IMODE(audit.parent.stat().st_mode) == 0o700, "the audit folder Kev made is the owner's alone"
    tenants = {json.loads(r)["tenant"] for r in audit.read_text().splitlines() if '"kind": "result"' in r}
    assert {"alice", "bob"} <= tenants, "each answer's audit record names its tenant"
    assert re.search(r"request [0-9a-f]{32} tenant=alice ", server.log()), "the access log names the tenant"


def test_two_authorization_headers_are_a_400(server: ServerProcess) -> None:
    for pair in ([KEYS["alice"], KEYS["bob"]], [KEYS["alice"], "wrong"], ["wrong", KEYS["alice"]]):
        response = httpx.get(f"{server.url}/v1/channels", timeout=30,
                             headers=[("Authorization", f"Bearer {key}") for key in pair])
        assert response.status_code == 400 and response.json()["error"]["field"] == "Authorization", pair


def test_a_websocket_without_the_key_is_refused(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /v1/query HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        head = sock.recv(1024).decode("latin-1")
    # 403: the gate closed the handshake; 401: a uvicorn without a websocket library sends it to the gate as HTTP
    assert head.split(" ")[1] in ("401", "403"), head
