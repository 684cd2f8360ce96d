"""What /v1/channels and the playground show of an engine's pool: each channel's state and whose question it holds."""
from __future__ import annotations

from typing import Any

from kev.engine.channel_pool import ChannelPool
from kev.engine.kv.block_manager import BlockManager


def channel_states(pool: ChannelPool, blocks: BlockManager) -> list[dict[str, Any]]:
    """Engine lock held: idle / prefill / decode per channel, its question, queue and KV blocks."""
    states = []
    for channel in pool.channels:
        q = channel.question
        states.append({
            "channel_id": channel.channel_id,
            "state": q.phase.value if q else "idle",
            "request_id": q.request_id if q else None,
            "index": q.index if q else None,
            "tokens": q.num_tokens if q else 0,
            "queued": len(channel.queue),
            "kv_blocks": len(blocks.block_table(channel.channel_id)),
            "num_served": channel.num_served,
        })
    return states
