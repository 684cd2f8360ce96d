"""The router, the aggregator and the config never import torch (their tests run in milliseconds)."""
from __future__ import annotations

import subprocess
import sys


def test_router_aggregator_and_scheduler_import_without_torch():
    code = ("import sys, kev, kev.router.router, kev.results.audit_records, kev.results.load_report, "
            "kev.engine.scheduler, kev.engine.channel_pool, kev.cli.stats_cmd; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
