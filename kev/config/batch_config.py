"""The `batch:` section of kev.yaml: where `kev serve` keeps uploaded files and batch state, and their limits.

It imports nothing from Kev so that kev/config/schema.py can embed it without a cycle.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Files and batch records of the HTTP Files/Batches API live here (a restart resumes what was running).
    dir: str = "~/.cache/kev/batches"
    max_file_bytes: int = Field(200 << 20, ge=64)  # an uploaded file (OpenAI's limit is 200 MB)
    max_requests: int = Field(50_000, ge=1)  # lines of one batch input file (OpenAI's limit)
    # Requests (lines) in flight at once per job; None: 2 x router.channel_pool_size x (1 + channel_queue_depth)
    # per engine (every channel busy and as many again ready, as if all were submitted at once).
    max_inflight: int | None = Field(None, ge=1)
    # Bytes of files one tenant may keep (uploads and batch outputs); None: no quota. An upload past it is a 413.
    tenant_quota_bytes: int | None = Field(10 << 30, ge=1)
    # Uploads without expires_after are deleted this long after upload (OpenAI: 3600 .. 2592000); None: kept.
    default_file_expiry_s: int | None = Field(30 * 24 * 3600, ge=3600, le=2_592_000)
