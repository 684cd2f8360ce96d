"""IsolationGuard: audits every step before its forward and fails affected questions loudly on an alert.

When a step raises an isolation alert, the affected questions get status "error"
with the alert as reason (at every level, not only strict: a silently wrong answer
is never better) and the step's forward is skipped; everyone else is re-planned
from clean metadata on the next step (nothing advanced, so their answers are unchanged).
"""
from __future__ import annotations

from kev.engine.postprocess import Postprocessor
from kev.engine.scheduler import Scheduler
from kev.isolation.audit import Alert, AuditLog, inspect_step
from kev.isolation.block_manager import BlockManager
from kev.model.step_metadata import StepMetadata


class IsolationGuard:
    def __init__(self, audit: AuditLog, blocks: BlockManager, scheduler: Scheduler, post: Postprocessor) -> None:
        self.audit, self.blocks, self.scheduler, self.post = audit, blocks, scheduler, post
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
            failed |= alert.is_isolation and self._fail_affected(alert)
        return not failed

    def _fail_affected(self, alert: Alert) -> bool:
        affected = [q for q in self.scheduler.running if q.channel_id in alert.channel_ids]
        for q in affected:
            self.scheduler.finish(q, "error", "error", f"isolation alert {alert.kind}: {alert.message}")
            self.post.complete(q)
        return bool(affected)
