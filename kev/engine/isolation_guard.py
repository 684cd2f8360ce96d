"""IsolationGuard: audits every step before its forward and fails affected questions loudly on an alert.

When a step raises an isolation alert, the affected questions get status "error"
with the alert as reason (at every level, not only strict: a silently wrong answer
is never better) and the step's forward is skipped; everyone else is re-planned
from clean metadata on the next step (nothing advanced, so their answers are unchanged).
"""
from __future__ import annotations

from collections.abc import Callable

from kev.engine.kv.audit import Alert, AuditLog, inspect_step
from kev.engine.kv.block_manager import BlockManager
from kev.model.step_metadata import StepMetadata

FailChannels = Callable[[list[int], str], bool]  # the scheduler's fail_channels: True when a question was running there


class IsolationGuard:
    def __init__(self, audit: AuditLog, blocks: BlockManager, fail_channels: FailChannels) -> None:
        self.audit, self.blocks, self.fail_channels = audit, blocks, fail_channels
        self.num_steps = 0

    def check(self, meta: StepMetadata) -> bool:
        """True when the step may run its forward."""
        self.num_steps += 1
        summary, alerts = inspect_step(meta, self.blocks)
        if self.audit.path:
            if self.audit.level == "summary":
                summary["channels"] = [{k: v for k, v in c.items() if k != "blocks"} for c in summary["channels"]]
            self.audit.write("step", step=self.num_steps, **summary)
        failed = False
        for alert in alerts:
            self.audit.alert(alert)
            if alert.is_isolation:
                failed |= self.fail_channels(alert.channel_ids, f"isolation alert {alert.kind}: {alert.message}")
        return not failed

    def check_idle(self) -> bool:
        """The block manager's invariants, checked whenever the engine goes idle (as mini-sglang does): a
        broken one is an isolation alert, since a mis-counted block could be handed to two channels."""
        problems = self.blocks.integrity_problems()
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            self.audit.alert(Alert("block_integrity", "; ".join(problems[:3]) + more))
        return not problems
