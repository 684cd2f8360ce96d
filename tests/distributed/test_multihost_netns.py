"""Multi-host for real (issue 36, item 2): NATS, the router (with the aggregator) and two workers each on a host of
its own, network namespaces joined by a bridge (tests/distributed/netns_lab.py), with TLS (a throwaway CA; NATS
verifies the client's certificate) and each role's own NATS user and the cluster secret on. The cluster answers as
single mode does, bit for bit; then one worker's link goes down mid-request (`ip link set ... down` in its
namespace): its questions are redelivered to the other worker, every question is answered once, none is lost or
doubled, and when the link comes back the late worker's answers change nothing.

Skipped, saying why, where the machine cannot make network namespaces (not root, no `ip`/`openssl`, EPERM)."""
from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from harness import ServerProcess, die_with_parent, wait_until

import kev
from kev.distributed.bus_auth import RoleUser, nats_config, new_users, write_private
from kev.distributed.connection import connect_options
from kev.distributed.messages import WorkItem, use_cluster_secret
from kev.distributed.nats_server import find_nats_server
from tests.distributed.cluster_harness import BASE, Role, merged
from tests.distributed.netns_lab import Lab, NsClient, certificates, enter, lab, why_no_namespaces
from tests.distributed.test_cluster_e2e import same_as_single
from tests.distributed.test_cluster_faults import QUESTIONS, held_while_running

pytestmark = pytest.mark.service
HOSTS = ["nats", "router", "worker0", "worker1"]  # the aggregator runs on the router's host


@dataclass
class MultiHost:
    lab: Lab
    client: NsClient  # the router's HTTP port, from inside its namespace
    nats: subprocess.Popen[bytes]
    roles: dict[str, Role]
    router: ServerProcess
    router_config: dict[str, Any]  # its NATS user, TLS and the cluster secret

    def heard(self, names: set[str]) -> bool:
        """Every named worker heard by the router (its heartbeats reach it); a role that died fails the wait."""
        for name, role in self.roles.items():
            assert role.proc is not None and role.proc.poll() is None, f"{name} exited:\n{role.log()[-3000:]}"
        live = {c.get("worker") for c in self.client.get("/v1/channels").json()["channels"]}
        return names <= live

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{role.log()[-2000:]}" for name, role in self.roles.items())


def start_nats(hosts: Lab, folder: Path, tls: dict[str, Path], users: dict[str, RoleUser]) -> subprocess.Popen[bytes]:
    """nats-server on the nats host's address only: TLS with client certificates, the role users, JetStream."""
    conf = folder / "nats.conf"  # nats-server reads JSON
    write_private(conf, json.dumps({
        "host": hosts.hosts["nats"], "port": 4222, "jetstream": {"store_dir": str(folder / "js")},
        # timeout: the handshake's limit (default 0.5 s; a loaded CI machine's Python client can take longer)
        "tls": {"cert_file": str(tls["server.pem"]), "key_file": str(tls["server.key"]),
                "ca_file": str(tls["ca.pem"]), "verify": True, "timeout": 10},
        **json.loads(nats_config(users, "kev"))}))
    log_path = folder / "nats-server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*hosts.exec_prefix("nats"), find_nats_server(), "--config", str(conf)],
                                stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
    try:
        wait_until(lambda: proc.poll() is not None or b"Server is ready" in log_path.read_bytes(), 60, "NATS up")
        assert proc.poll() is None, log_path.read_text()
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    return proc


def role_config(hosts: Lab, role: str, users: dict[str, RoleUser], secret: str, tls: dict[str, Path]) -> dict:
    return merged(BASE, {"deploy": {
        "nats_url": f"tls://{hosts.hosts['nats']}:4222", "nats_user": f"kev-{role}",
        "nats_password": users[role].password, "cluster_secret": secret,
        "nats_tls": {"ca_file": str(tls["ca.pem"]), "cert_file": str(tls["client.pem"]),
                     "key_file": str(tls["client.key"])}}})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    if (reason := why_no_namespaces()) is not None:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("kev-multihost")
    with lab(HOSTS) as hosts:
        tls = certificates(folder / "tls", hosts.hosts["nats"])
        users, secret = new_users(), secrets.token_urlsafe(32)
        nats = start_nats(hosts, folder, tls, users)
        roles: dict[str, Role] = {}
        router: ServerProcess | None = None
        client: NsClient | None = None
        try:
            for name, role, host, args in (("aggregator", "aggregator", "router", []),
                                           ("worker0", "worker", "worker0", ["--partition", "0"]),
                                           ("worker1", "worker", "worker1", ["--partition", "1"])):
                path = folder / f"{name}.json"
                write_private(path, json.dumps({"kev": role_config(hosts, role, users, secret, tls)}))
                extra = ["--id", name, "--grace", "5"] if role == "worker" else []
                roles[name] = Role(name, [role, "--config", str(path), *args, *extra], folder / f"{name}.log",
                                   prefix=hosts.exec_prefix(host)).start()
            router_config = role_config(hosts, "router", users, secret, tls)
            router = ServerProcess(router_config, folder / "router",
                                   prefix=hosts.exec_prefix("router")).start(timeout=600, ready=False)
            client = NsClient(hosts.ns("router"), router.url)
            found = MultiHost(hosts, client, nats, roles, router, router_config)
            wait_until(lambda: found.client.get("/readyz").status_code == 200, 600, "the router ready")
            wait_until(lambda: found.heard({"worker0", "worker1"}), 600, "both workers heard")
            yield found
        except BaseException:
            print("\n".join(f"--- {n}\n{r.log()[-2000:]}" for n, r in roles.items()))
            if router is not None:
                print(f"--- router\n{router.log()[-2000:]}")
            raise
        finally:
            if client is not None:
                client.close()
            codes = {"router": router.terminate() if router is not None else None}
            codes |= {name: role.terminate() for name, role in roles.items() if name != "aggregator"}
            codes["aggregator"] = roles["aggregator"].terminate() if "aggregator" in roles else None
            nats.terminate()
            nats.wait(30)
    assert all(code in (0, None) for code in codes.values()), f"a role did not stop cleanly: {codes}"


def test_answers_equal_single_mode_across_hosts_with_tls(cluster: MultiHost,
                                                         reference: Callable[..., list[dict[str, Any]]]) -> None:
    body = {"queries": QUESTIONS[:4], "max_tokens": 6}
    response = cluster.client.post("/v1/query", json=body)
    assert response.status_code == 200, response.text
    same_as_single(response.json()["results"], reference(**body))


def test_a_work_item_without_the_cluster_secrets_tag_is_dropped(cluster: MultiHost) -> None:
    """Even from a holder of the router's NATS credential: an untagged item, and one tagged with another secret,
    claiming tenant alice, are dead letters (the worker's reason names the tag); neither is run."""
    deploy = kev.load_config(cluster.router_config).deploy
    dead: list[Any] = []

    async def forge() -> None:
        nc = await nats.connect(**{**connect_options(deploy, "forger", "router"), "allow_reconnect": False})
        try:
            js = nc.jetstream(timeout=10)
            for n, secret in enumerate((None, "another secret of at least 32 characters")):
                use_cluster_secret(secret)
                item = WorkItem(request_id=f"{n}" * 32, index=0, question="Tell me alice's secret.",
                                reply="router", submitted_at=time.time(), options={"tenant": "alice"})
                await js.publish("kev.work.p0", item.encode())
            deadline = time.monotonic() + 120
            while (info := await js.stream_info("KEV_DEAD", subjects_filter="kev.dead.work")).state.messages < 2:
                assert time.monotonic() < deadline, "the forged items were not dead-lettered"
                await asyncio.sleep(0.1)
            dead.append(info.state.messages)
            with pytest.raises(nats.errors.TimeoutError):  # no role reads dead letters (bus_auth.py)
                await js.get_last_msg("KEV_DEAD", "kev.dead.work")
        finally:
            use_cluster_secret(None)
            await nc.close()

    def in_router_host() -> None:
        enter(cluster.lab.ns("router"))
        asyncio.run(forge())

    failed: list[BaseException] = []
    thread = threading.Thread(target=lambda: _catch(in_router_host, failed))
    thread.start()
    thread.join(300)
    if failed:
        raise failed[0]
    [count] = dead
    reasons = [line for role in ("worker0", "worker1") for line in cluster.roles[role].log().splitlines()
               if "dead letter from kev.work.p0" in line]
    assert count == 2 and len(reasons) == 2 and all("authentication tag" in r for r in reasons), reasons


def _catch(run: Callable[[], None], failed: list[BaseException]) -> None:
    try:
        run()
    except BaseException as err:  # re-raised in the test's thread
        failed.append(err)


def test_a_worker_whose_link_goes_down_loses_nothing(cluster: MultiHost,
                                                     reference: Callable[..., list[dict[str, Any]]]) -> None:
    body = {"queries": QUESTIONS, "max_tokens": 24}
    expected = reference(**body)
    client = cluster.client
    accepted, held = held_while_running(client, "worker1", body)  # type: ignore[arg-type]
    cluster.lab.set_link("worker1", "down")  # worker1 runs on, cut off: no answer, ack or heartbeat gets out
    try:
        status = wait_until(lambda: (s := client.get(accepted["location"]).json())["status"] == "done" and s, 300,
                            "the request answered without worker1")
    finally:
        cluster.lab.set_link("worker1", "up")
    results = status["results"]
    assert sorted(r["index"] for r in results) == list(range(len(QUESTIONS))), "every question answered, once"
    same_as_single(results, expected)
    assert all(results[i]["worker"] == "worker0" for i in held), f"worker1 held {held}: redelivered to worker0"
    # Back on the network, worker1 reconnects; whatever it answered while cut off arrives late and loses (the
    # first answer of each question wins): the request's answers stay what they were.
    wait_until(lambda: cluster.heard({"worker0", "worker1"}), 300, "worker1 heard again")
    again = client.get(accepted["location"]).json()
    assert again["results"] == results and again["num_finished"] == len(QUESTIONS), "nothing doubled or changed"
