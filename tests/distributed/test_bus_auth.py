"""The cluster bus only Kev can use (kev/distributed/bus_auth.py): a real nats-server with `kev cluster up`'s users
and permissions, and a real nats-py client: no credentials, the connection is refused; another role's, publishing
or taking what is not its role's is denied (a forged work item from a worker's credentials, a spoofed answer from
the router's, a worker pulling answers); and a message without the cluster secret's tag is refused on receipt."""
from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import nats
import pytest
from nats.errors import NoServersError

from kev.errors import KevError

from kev.config.deploy_config import DeployConfig
from kev.distributed.bus_auth import RoleUser, nats_config, new_users, write_private
from kev.distributed.connection import NotDeclared, Role, connect
from kev.distributed.nats_server import NatsServer

pytestmark = pytest.mark.service


async def violations(url: str, user: str, password: str, subject: str, subscribe: bool = False) -> list[str]:
    """Publish to subject (or subscribe to it) as user; the permission errors the server sent back."""
    seen: list[str] = []

    async def on_error(err: Exception) -> None:
        seen.append(str(err))

    nc = await nats.connect(url, user=user, password=password, error_cb=on_error, allow_reconnect=False)
    try:
        if subscribe:
            await nc.subscribe(subject)
        else:
            await nc.publish(subject, b"forged")
        await nc.flush(5)
        for _ in range(50):  # the server's -ERR arrives after the flush's PONG at the latest
            if seen:
                break
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    return seen


def start_server(tmp_path: Path, users: dict[str, RoleUser]) -> NatsServer:
    folder = tmp_path / "nats"
    folder.mkdir(mode=0o700)
    conf = folder / "users.conf"
    write_private(conf, nats_config(users, "kev"))
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    return NatsServer(folder, config_file=conf).start()


def denied(seen: list[str]) -> bool:
    return bool(seen) and "permissions violation" in seen[0].lower()


def test_no_credentials_is_refused_and_each_role_only_does_its_own(tmp_path: Path) -> None:
    users = new_users()
    server = start_server(tmp_path, users)
    try:
        async def check() -> None:
            with pytest.raises((NoServersError, nats.errors.Error, OSError)):
                await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
            with pytest.raises((NoServersError, nats.errors.Error, OSError)):
                await nats.connect(server.url, user="kev-worker", password="guess", allow_reconnect=False,
                                   max_reconnect_attempts=0, connect_timeout=2)
            forged = await violations(server.url, "kev-worker", users["worker"].password, "kev.work.p0")
            assert forged and "permissions violation" in forged[0].lower(), "a worker cannot publish work items"
            spoofed = await violations(server.url, "kev-router", users["router"].password, "kev.result.r1")
            assert spoofed and "permissions violation" in spoofed[0].lower(), "the router cannot publish answers"
            kv = await violations(server.url, "kev-worker", users["worker"].password, "$KV.kev_answers.r1.0")
            assert kv and "permissions violation" in kv[0].lower(), "a worker cannot write the answers bucket"
            pull = await violations(server.url, "kev-worker", users["worker"].password,
                                    "$JS.API.CONSUMER.MSG.NEXT.KEV_RESULTS.KEV_aggregator")
            assert pull and "permissions violation" in pull[0].lower(), "a worker cannot take answers"
            take = await violations(server.url, "kev-aggregator", users["aggregator"].password,
                                    "$JS.API.CONSUMER.MSG.NEXT.KEV_WORK.KEV_p0")
            assert take and "permissions violation" in take[0].lower(), "the aggregator cannot take work items"
            ok = await violations(server.url, "kev-router", users["router"].password, "kev.work.p0")
            assert ok == [], "the router's own subject"
            heard = await violations(server.url, "kev-worker", users["worker"].password, "kev.status.*", True)
            assert heard == [], "a worker hears the others' status (which partitions have no live worker)"
            peek = await violations(server.url, "kev-worker", users["worker"].password, "kev.work.>", True)
            assert peek and "permissions violation" in peek[0].lower(), "a worker cannot read work items as sent"
            claim = await violations(server.url, "kev-router", users["router"].password, "$KV.kev_answers.r1.0")
            assert claim == [], "the router claims a cancelled question's answer (docs/distributed.md says so)"
        asyncio.run(check())
    finally:
        server.stop()


# The JetStream API calls no role's code makes: each would read or destroy what another role holds.
API = "$JS.API"
NEVER = [f"{API}.STREAM.{verb}.{stream}" for verb in ("PURGE", "DELETE", "UPDATE")
         for stream in ("KEV_WORK", "KEV_RESULTS", "KEV_DEAD", "KV_kev_answers", "KV_kev_requests")] + [
    f"{API}.CONSUMER.DELETE.KEV_WORK.KEV_p0", f"{API}.CONSUMER.DELETE.KEV_RESULTS.KEV_aggregator",
    f"{API}.STREAM.MSG.GET.KEV_WORK", f"{API}.STREAM.MSG.GET.KEV_RESULTS", f"{API}.DIRECT.GET.KEV_RESULTS",
    f"{API}.STREAM.MSG.GET.KEV_DEAD",  # dead letters hold the bytes as sent: an operator's to read
    f"{API}.STREAM.MSG.DELETE.KV_kev_answers",
    f"{API}.CONSUMER.CREATE.KEV_RESULTS",  # an ephemeral consumer delivering the answers wherever it says
    f"{API}.CONSUMER.CREATE.KEV_RESULTS.spy.kev.result.>", f"{API}.CONSUMER.DURABLE.CREATE.KEV_RESULTS.spy"]
DENIED: dict[str, list[str]] = {
    "router": [*NEVER, f"{API}.CONSUMER.MSG.NEXT.KEV_WORK.KEV_p0",
               f"{API}.CONSUMER.MSG.NEXT.KEV_RESULTS.KEV_aggregator"],
    "worker": [*NEVER, f"{API}.STREAM.CREATE.KEV_WORK", f"{API}.CONSUMER.CREATE.KEV_WORK",
               f"{API}.CONSUMER.DURABLE.CREATE.KEV_WORK.spy", f"{API}.CONSUMER.MSG.NEXT.KEV_RESULTS.KEV_aggregator",
               f"{API}.DIRECT.GET.KV_kev_answers.$KV.kev_answers.r1.0", f"{API}.STREAM.MSG.GET.KV_kev_answers",
               f"{API}.STREAM.INFO.KV_kev_answers", f"{API}.CONSUMER.CREATE.KV_kev_answers",
               f"{API}.CONSUMER.CREATE.KV_kev_requests"],
    "aggregator": [*NEVER, f"{API}.STREAM.CREATE.KEV_WORK", f"{API}.CONSUMER.CREATE.KEV_WORK",
                   f"{API}.CONSUMER.DURABLE.CREATE.KEV_WORK.spy", f"{API}.CONSUMER.MSG.NEXT.KEV_WORK.KEV_p0",
                   f"{API}.CONSUMER.INFO.KEV_WORK.KEV_p0", f"{API}.CONSUMER.CREATE.KV_kev_answers"],
}
INBOXES = ["_INBOX.>", "_INBOX_kev_router.>", "_INBOX_kev_worker.>", "_INBOX_kev_aggregator.>"]


def deploy_of(server: NatsServer, role: str, users: dict[str, RoleUser]) -> DeployConfig:
    return DeployConfig(mode="distributed", nats_url=server.url, workers=2, nats_user=f"kev-{role}",
                        nats_password=users[role].password)


def test_each_role_calls_only_its_own_jetstream_api(tmp_path: Path) -> None:
    """No role may purge or delete a stream, read another role's stream by number, or make a consumer that delivers
    elsewhere; nor hear another role's inbox (where JetStream sends what it pulls). With exactly the rest, each role
    of Kev's own code connects and does its work: the router declares, the others find what it declared (and wait
    until it has), a worker pulls work, the aggregator pulls answers, claims one and follows the requests bucket."""
    users = new_users()
    server = start_server(tmp_path, users)
    try:
        async def check() -> None:
            for role, subjects in DENIED.items():
                user, password = f"kev-{role}", users[role].password
                for subject in subjects:
                    assert denied(await violations(server.url, user, password, subject)), f"{role}: {subject}"
                for inbox in INBOXES:
                    if inbox != f"_INBOX_kev_{role}.>":
                        assert denied(await violations(server.url, user, password, inbox, True)), f"{role}: {inbox}"

            with pytest.raises(NotDeclared, match="router declares"):  # no router yet: the worker waits
                await connect(deploy_of(server, "worker", users), "early-worker", "worker")
            links = {}
            roles: tuple[Role, ...] = ("router", "worker", "aggregator")
            for role in roles:
                links[role] = await connect(deploy_of(server, role, users), f"test-{role}", role)
            router, worker, aggregator = links["router"], links["worker"], links["aggregator"]
            try:
                await router.js.publish("kev.work.p0", b"item", timeout=5)
                await router.requests.put("r1", b"record")
                work = await worker.js.pull_subscribe_bind(durable="KEV_p0", stream="KEV_WORK")
                [msg] = await work.fetch(1, timeout=5)
                assert msg.data == b"item"
                await msg.ack()
                await worker.js.publish("kev.result.r1", b"answer", timeout=5)
                results = await aggregator.js.pull_subscribe_bind(durable="KEV_aggregator", stream="KEV_RESULTS")
                [answer] = await results.fetch(1, timeout=5)
                assert answer.data == b"answer"
                await answer.ack()
                assert await aggregator.answers.create("r1.0", b"accepted") >= 1
                assert (await router.answers.get("r1.0")).value == b"accepted"
                watcher = await aggregator.requests.watchall()
                entry = await asyncio.wait_for(watcher.updates(timeout=5), 10)
                assert entry is not None and entry.key == "r1"
                await watcher.stop()
                with pytest.raises(KevError):  # a worker has no buckets at all
                    _ = worker.answers
            finally:
                for link in links.values():
                    await link.nc.close()
        asyncio.run(check())
    finally:
        server.stop()


def test_a_message_without_the_cluster_secrets_tag_is_never_read() -> None:
    from kev.distributed.messages import MalformedMessage, WorkItem, decode, seal, unseal, use_cluster_secret

    item = WorkItem(request_id="r1", index=0, question="Say hi.", reply="router1", submitted_at=0.0)
    try:
        use_cluster_secret("s" * 40)
        sealed = item.encode()
        assert decode(WorkItem, sealed) == item
        forged = item.model_copy(update={"options": {"tenant": "alice"}}).model_dump_json().encode()
        for data in (forged, b"0" * 64 + b" " + forged, sealed.replace(b"Say hi.", b"Say no.")):
            with pytest.raises(MalformedMessage, match="authentication tag"):
                decode(WorkItem, data)
        with pytest.raises(MalformedMessage):
            unseal(b'{"text": "SPOOFED"}', "answer")
        use_cluster_secret("t" * 40)
        with pytest.raises(MalformedMessage):
            decode(WorkItem, sealed)
    finally:
        use_cluster_secret(None)
    assert decode(WorkItem, item.encode()) == item and seal(b"x") == b"x", "no secret: no tags"
