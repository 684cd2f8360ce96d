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

from kev.distributed.bus_auth import nats_config, new_users, write_private
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


def test_no_credentials_is_refused_and_each_role_only_does_its_own(tmp_path: Path) -> None:
    users = new_users()
    folder = tmp_path / "nats"
    folder.mkdir(mode=0o700)
    conf = folder / "users.conf"
    write_private(conf, nats_config(users, "kev"))
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    server = NatsServer(folder, config_file=conf).start()
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
