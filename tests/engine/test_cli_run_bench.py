"""`kev run --json` and `kev bench --json`: the output contracts a user scripts against."""
from __future__ import annotations

import io
import json

import pytest

import kev
from kev.cli.main import main

RESULT_FIELDS = {"text", "token_ids", "tokens", "prompt_tokens", "completion_tokens", "channel_id", "index",
                 "elapsed_ms", "started_at", "finished_at", "finish_reason", "status"}


def test_kev_run_json_prints_one_result_per_question(capsys):
    code = main(["run", "--max-tokens", "4", "--json", "What is 2+2?", "解释一下什么是KV Cache", "Hi"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert code == 0
    assert [r["index"] for r in lines] == [0, 1, 2]
    for r in lines:
        assert RESULT_FIELDS <= r.keys()
        assert r["status"] == "ok" and 1 <= r["completion_tokens"] <= 4
        assert r["tokens"] == r["prompt_tokens"] + r["completion_tokens"]
        assert isinstance(r["channel_id"], int)


def test_kev_run_reads_questions_from_a_file_and_stdin(capsys, monkeypatch, tmp_path):
    (tmp_path / "questions.txt").write_text("What is 2+2?\n\n  Hi  \n", encoding="utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO("Name a colour.\n"))
    code = main(["run", "--max-tokens", "2", "--json", "first", "-", "--file", str(tmp_path / "questions.txt")])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert code == 0
    originals = [r["original_text"] for r in lines]
    assert originals == ["first", "Name a colour.", "What is 2+2?", "Hi"], "- is stdin, not a question"


def test_kev_run_timeout_cancels_what_is_unfinished(capsys):
    assert main(["run", "--timeout", "0", "--json", "Hi"]) == 1
    [line] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert (line["status"], line["finish_reason"]) == ("cancelled", "cancelled")


def test_kev_run_without_questions_and_kev_version(capsys):
    assert main(["run", "--file", "/nonexistent/questions.txt"]) == 2
    assert "--file /nonexistent/questions.txt: No such file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith(f"kev {kev.__version__} ")


@pytest.mark.slow
def test_kev_bench_json_reports_every_path_and_ratio(capsys):
    code = main(["bench", "--sizes", "1,2", "--max-tokens", "3", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert {"model", "precision", "threads", "results", "ratios"} <= report.keys()
    paths = {(r["n"], r["path"]) for r in report["results"]}
    assert {(n, p) for n in (1, 2) for p in ("kev", "serial", "hf_batch")} <= paths
    for r in report["results"]:
        assert r["tokens"] == 3 * r["n"] and r["seconds"] > 0 and r["tok_per_s"] > 0
        if r["path"] in ("kev", "serial"):
            assert r["identical_to_solo"] == f"{r['n']}/{r['n']}"
    assert {"kev_over_serial", "kev_over_hf_batch"} <= report["ratios"]["2"].keys()
