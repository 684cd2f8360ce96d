"""lm-evaluation-harness (its own venv, .venv-lmeval) against `kev serve` agrees with its Hugging Face backend.

About 75 s on two cores; skipped where the lm-eval venv was not made (bench/lm_eval/run.py says how)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.service]
ROOT = Path(__file__).resolve().parents[2]
LM_EVAL = ROOT / ".venv-lmeval" / "bin" / "lm_eval"


@pytest.mark.skipif(not LM_EVAL.exists(), reason="no .venv-lmeval (see bench/lm_eval/run.py)")
def test_lm_eval_scores_equal_the_hf_backend(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "lm_eval" / "run.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "| kev_gen | generations identical | 12/12 |" in run.stdout
