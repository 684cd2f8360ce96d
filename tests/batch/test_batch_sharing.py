"""A server's batches share it (docs/security.md, "Sharing"): their outputs count in the tenant's
batch.tenant_quota_bytes as uploads do, so a batch stops and fails naming the limit instead of passing it; what it
answered stays readable, and another tenant's live request is answered meanwhile."""
from __future__ import annotations

import time

import httpx
import pytest
from harness import ServerProcess

from tests.batch.batch_files import CONFIG, job_lines, write_jsonl

pytestmark = pytest.mark.service
QUOTA = 6_000


def test_batch_outputs_count_in_the_tenants_quota(start_server, tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("kev-sharing")
    server: ServerProcess = start_server({**CONFIG, "server": {"api_keys": {"a": "key-a", "b": "key-b"}},
                                          "batch": {"dir": str(folder / "b"), "tenant_quota_bytes": QUOTA}},
                                         api_key="key-default")  # the harness asks /readyz with it
    b = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer key-b"}, timeout=300)
    a = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer key-a"}, timeout=300)
    lines = [line for line in job_lines(24) if line["url"] == "/v1/chat/completions"]
    path = write_jsonl(folder / "in.jsonl", lines)
    file_id = b.post("/v1/files", data={"purpose": "batch"},
                     files={"file": ("in.jsonl", path.read_bytes())}).json()["id"]
    batch = b.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                        "completion_window": "24h"}).json()
    # a live request of another tenant meanwhile: answered
    assert a.post("/v1/query", json={"queries": ["Say hi."], "max_tokens": 2}).json()["results"][0]["status"] == "ok"
    deadline = time.monotonic() + 600
    while (batch := b.get(f"/v1/batches/{batch['id']}").json())["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    assert batch["status"] == "failed", "twelve answers do not fit beside the upload in 6,000 bytes"
    error = batch["errors"]["data"][0]
    assert error["param"] == "batch.tenant_quota_bytes" and "tenant 'b'" in error["message"], error
    used = sum(f["bytes"] for f in b.get("/v1/files").json()["data"])
    assert used <= QUOTA, f"the tenant's files take {used} bytes, past its quota"
    kept = b.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()
    assert 0 < len(kept) < 12, "what it answered before the limit stays readable"
