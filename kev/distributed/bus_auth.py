"""The cluster bus only Kev can use: per-role NATS users for `kev cluster up` (docs/security.md, "The cluster").

Each role (router, worker, aggregator) gets its own user and a random password, and NATS its permissions: only the
router publishes work items and cancels and writes the requests bucket (and claims a cancelled question's answer);
only workers take work items (pull from the work stream) and publish answers and deltas; only the aggregator takes
answers (pulls the results stream) and relays them to routers. Of the JetStream API each role may call what its
code calls and nothing else (permissions() below): only the router declares streams and consumers, nobody deletes
or purges them, and replies come to each role's own inboxes. NATS refuses any connection without a user, so a
local process that holds no credential reads and writes nothing. Files are 0600 in a 0700 folder.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

ROLES = ("router", "worker", "aggregator")


@dataclass(frozen=True)
class RoleUser:
    role: str
    password: str


def private_folder(folder: Path) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def write_private(path: Path, text: str) -> None:
    """Write text readable by the owner alone (created 0600; an older file is made 0600 first)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def new_users() -> dict[str, RoleUser]:
    return {role: RoleUser(role, secrets.token_urlsafe(24)) for role in ROLES}


def inbox_prefix(role: str, prefix: str) -> str:
    """The role's reply subjects (nats.connect(inbox_prefix=...)). JetStream answers a role's API calls and pulls
    there, so each role subscribes to its own inboxes alone: never to another role's (a worker's pulled work items,
    the aggregator's pulled answers)."""
    return f"_INBOX_{prefix}_{role}"


def permissions(role: str, prefix: str) -> dict[str, dict[str, list[str]]]:
    """NATS publish/subscribe permissions of a role: the subjects and JetStream API calls its code makes, no more.

    The router declares the cluster (kev/distributed/connection.py: streams, durable consumers, buckets), so it
    alone may create them. Nobody may update, delete or purge a stream, delete a durable consumer, or read a
    stream's messages by number, except the answers bucket's two readers (router and aggregator) reading it.
    Workers look up and pull the work consumers; the aggregator looks up and pulls its results consumer, and
    follows the requests bucket (an ordered consumer of its own: create, info, delete, flow control)."""
    p, P, api = prefix, prefix.upper(), "$JS.API"
    work, results, requests, answers = f"{P}_WORK", f"{P}_RESULTS", f"KV_{p}_requests", f"KV_{p}_answers"
    own_inbox = f"{inbox_prefix(role, prefix)}.>"
    read_answers = [f"{api}.STREAM.INFO.{answers}", f"{api}.DIRECT.GET.{answers}.>", f"{api}.DIRECT.GET.{answers}",
                    f"{api}.STREAM.MSG.GET.{answers}"]
    aggregator = f"{P}_aggregator"
    if role == "router":
        streams = [work, results, f"{P}_DEAD", requests, answers]
        declare = [*(f"{api}.STREAM.{verb}.{s}" for s in streams for verb in ("CREATE", "INFO")),
                   # the durable consumers by name (nats-py's legacy subject, and the named one of newer clients)
                   f"{api}.CONSUMER.DURABLE.CREATE.{work}.*", f"{api}.CONSUMER.CREATE.{work}.*.>",
                   f"{api}.CONSUMER.DURABLE.CREATE.{results}.{aggregator}",
                   f"{api}.CONSUMER.CREATE.{results}.{aggregator}.>",
                   # /metrics: each work consumer's backlog and the aggregator's
                   f"{api}.CONSUMER.INFO.{work}.*", f"{api}.CONSUMER.INFO.{results}.{aggregator}"]
        # the answers bucket: a cancelled question's answer is the router's to claim (and the winner's to read back)
        return {"publish": {"allow": [f"{p}.work.>", f"{p}.cancel", f"$KV.{p}_requests.>", f"$KV.{p}_answers.>",
                                      *declare, *read_answers]},
                "subscribe": {"allow": [f"{p}.out.>", f"{p}.status.>", own_inbox]}}
    if role == "worker":
        return {"publish": {"allow": [f"{p}.result.>", f"{p}.delta.>", f"{p}.status.>", f"{p}.dead.>",
                                      f"$JS.ACK.{work}.>", f"{api}.CONSUMER.INFO.{work}.*",
                                      f"{api}.CONSUMER.MSG.NEXT.{work}.*"]},
                # the other workers' status: which partitions have no live worker (worker.py serves those first)
                "subscribe": {"allow": [f"{p}.cancel", f"{p}.status.>", own_inbox]}}
    return {"publish": {"allow": [f"{p}.out.>", f"{p}.dead.>", f"$KV.{p}_answers.>", f"$JS.ACK.{results}.>",
                                  f"{api}.CONSUMER.INFO.{results}.{aggregator}",
                                  f"{api}.CONSUMER.MSG.NEXT.{results}.{aggregator}", *read_answers,
                                  f"{api}.STREAM.INFO.{requests}", f"{api}.CONSUMER.CREATE.{requests}",
                                  f"{api}.CONSUMER.CREATE.{requests}.>", f"{api}.CONSUMER.INFO.{requests}.*",
                                  f"{api}.CONSUMER.DELETE.{requests}.*", f"$JS.FC.{requests}.>"]},
            "subscribe": {"allow": [f"{p}.delta.>", own_inbox]}}


def nats_config(users: dict[str, RoleUser], prefix: str) -> str:
    """nats-server's config (its format reads JSON): the role users and their permissions; no anonymous access."""
    return json.dumps({"authorization": {"users": [
        {"user": f"kev-{u.role}", "password": u.password, "permissions": permissions(u.role, prefix)}
        for u in users.values()]}}, indent=1)
