"""The cluster bus only Kev can use: per-role NATS users for `kev cluster up` (docs/security.md, "The cluster").

Each role (router, worker, aggregator) gets its own user and a random password, and NATS its permissions: only the
router publishes work items and cancels and writes the requests bucket (and claims a cancelled question's answer);
only workers take work items (pull from the work stream) and publish answers and deltas; only the aggregator takes
answers (pulls the results stream) and relays them to routers. Every role may use the JetStream API to declare
what it needs, minus the pulls and reads that are another role's. NATS refuses any connection without a user, so a
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


def permissions(role: str, prefix: str) -> dict[str, dict[str, list[str]]]:
    """NATS publish/subscribe permissions of a role (deny wins over allow)."""
    p, P = prefix, prefix.upper()
    js = ["$JS.API.>", "$JS.FC.>", "_INBOX.>"]
    take_work = f"$JS.API.CONSUMER.MSG.NEXT.{P}_WORK.>"
    take_results = f"$JS.API.CONSUMER.MSG.NEXT.{P}_RESULTS.>"
    read_answers = [f"$JS.API.DIRECT.GET.KV_{p}_answers.>", f"$JS.API.DIRECT.GET.KV_{p}_answers",
                    f"$JS.API.STREAM.MSG.GET.KV_{p}_answers"]
    if role == "router":
        # the answers bucket: a cancelled question's answer is the router's to claim
        return {"publish": {"allow": [f"{p}.work.>", f"{p}.cancel", f"{p}.dead.>", f"$KV.{p}_requests.>",
                                      f"$KV.{p}_answers.>", *js],
                            "deny": [take_work, take_results]},
                "subscribe": {"allow": [f"{p}.out.>", f"{p}.status.>", "_INBOX.>"]}}
    if role == "worker":
        return {"publish": {"allow": [f"{p}.result.>", f"{p}.delta.>", f"{p}.status.>", f"{p}.dead.>", "$JS.ACK.>",
                                      *js],
                            "deny": [take_results, *read_answers]},
                # the other workers' status: which partitions have no live worker (worker.py serves those first)
                "subscribe": {"allow": [f"{p}.cancel", f"{p}.status.>", "_INBOX.>"]}}
    return {"publish": {"allow": [f"{p}.out.>", f"{p}.dead.>", f"$KV.{p}_answers.>", "$JS.ACK.>", *js],
                        "deny": [take_work]},
            "subscribe": {"allow": [f"{p}.delta.>", "_INBOX.>"]}}


def nats_config(users: dict[str, RoleUser], prefix: str) -> str:
    """nats-server's config (its format reads JSON): the role users and their permissions; no anonymous access."""
    return json.dumps({"authorization": {"users": [
        {"user": f"kev-{u.role}", "password": u.password, "permissions": permissions(u.role, prefix)}
        for u in users.values()]}}, indent=1)
