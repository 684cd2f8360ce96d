"""Dead letters: a message nobody can read goes to {p}.dead.<kind> with the reason, and is never retried."""
from __future__ import annotations

import logging

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from kev.distributed.subjects import Topology

log = logging.getLogger("kev.distributed")
REASON = "Kev-Reason"  # headers of a dead letter
SOURCE = "Kev-Source-Subject"
SENDER = "Kev-Rejected-By"


async def reject(js: JetStreamContext, topology: Topology, msg: Msg, kind: str, reason: str, by: str) -> None:
    """Park the message's bytes, untouched, with the reason; then terminate its delivery (no redelivery).

    If parking fails (NATS away), the delivery is left alone: it comes back after ack_wait and is rejected then."""
    log.warning("dead letter from %s (%s): %s", msg.subject, kind, reason)
    headers = {REASON: reason[:1000].replace("\r", " ").replace("\n", " "), SOURCE: msg.subject, SENDER: by}
    await js.publish(topology.dead_subject(kind), msg.data, headers=headers)
    if msg.reply:  # a JetStream delivery: TERM, so it is never redelivered
        await msg.term()
