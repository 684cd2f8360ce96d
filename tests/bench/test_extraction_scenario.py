"""`kev bench --scenario extraction`: plain and drafted answers side by side in one run, every drafted answer
identical to the plain one, drafts kept on questions that copy their document; an anchor the scenario cannot run is
refused, never ignored."""
from __future__ import annotations

import json

import pytest

from kev.cli.main import main


@pytest.mark.slow
def test_drafted_extraction_answers_equal_plain_and_keep_drafts(capsys, tmp_path):
    config = tmp_path / "kev.yaml"  # every draft the row cap allows: the measured policy may judge them not worth it
    config.write_text("speculative: {policy: rows}\n")
    code = main(["bench", "--scenario", "extraction", "--config", str(config), "--sizes", "1,4", "--draft-rows", "8",
                 "--max-tokens", "16", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert report["max_tokens"] == 16 and report["precision"] == "gguf"  # a .gguf default runs its own blocks
    rows = {(r["n"], r["path"]): r for r in report["rows"]}
    assert set(rows) == {(n, p) for n in (1, 4) for p in ("plain", "drafts rows<=8")}
    for (n, path), row in rows.items():
        assert row["identical_to_plain"] == "4/4", (n, path)
        assert 0 < row["tokens"] <= 16 * 4 and row["steps"] > 0
    drafted = rows[(1, "drafts rows<=8")]
    assert drafted["accepted"] > 0 and drafted["steps"] < rows[(1, "plain")]["steps"]


def test_an_anchor_the_scenario_cannot_run_is_refused(capsys):
    assert main(["bench", "--scenario", "extraction", "--against", "llamacpp"]) == 2
    assert "--against llamacpp does not run with --scenario extraction (it takes: vllm)" in capsys.readouterr().err
