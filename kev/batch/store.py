"""BatchStore: the Files and Batches API's state on disk (batch.dir), so a restarted server finds it all again.

    files/<file_id>.data    the bytes (an output file grows here while its batch runs)
    files/<file_id>.json    the OpenAI File object; written when the file is complete
    batches/<batch_id>.json the OpenAI Batch object, plus Kev's own "kev" key (its output files)

Objects are replaced atomically (write a temporary file, then rename), so a kill leaves the
old version or the new one, never half of one. Every file and batch belongs to a tenant (its
"kev" key; one written before tenants existed is the "default" tenant's): another tenant never
finds it. Everything is written 0600 in folders of 0700: uploads and answers are the owner's alone.
An upload is copied to disk in chunks as it arrives, so memory does not grow with its size.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import time
import unicodedata
from pathlib import Path
from typing import Any, BinaryIO

from kev.config.server_config import DEFAULT_TENANT
from kev.errors import ConfigError, describe_os_error

_FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
_BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")
_UNSAFE_NAME = re.compile(r"[^\w.\- ]")  # kept: letters and digits of any script, '_', '.', '-', space
CHUNK = 1 << 20


class QuotaError(Exception):
    """The upload would take the tenant past batch.tenant_quota_bytes (the message says by how much)."""


def safe_filename(name: str) -> str:
    """The last path part, control and quoting characters replaced: safe in a header and in a listing."""
    base = re.split(r"[\\/]", unicodedata.normalize("NFKC", name))[-1].strip().lstrip(".")
    return _UNSAFE_NAME.sub("_", base)[:200] or "upload.jsonl"


class BatchStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.files_dir, self.batches_dir = self.root / "files", self.root / "batches"
        for folder in (self.root, self.files_dir, self.batches_dir):
            try:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as err:  # a read-only or foreign folder: one line at start-up, naming the setting
                raise ConfigError(f"batch.dir: {describe_os_error(err, folder)}") from None

    # --- files -----------------------------------------------------------------
    @staticmethod
    def new_file_id() -> str:
        return "file-" + secrets.token_hex(12)  # 96 bits from the OS's CSPRNG

    def data_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.data"

    def add_file(self, source: BinaryIO, filename: str, purpose: str, tenant: str, max_bytes: int,
                 quota_bytes: int | None = None, expires_after_s: int | None = None) -> dict[str, Any]:
        """Copy an upload to disk in chunks; ValueError past max_bytes, QuotaError past the tenant's quota."""
        file_id = self.new_file_id()
        path = self.data_path(file_id)
        used = self.usage(tenant)
        room = None if quota_bytes is None else quota_bytes - used
        try:
            with open(private(path), "wb") as out:
                while chunk := source.read(CHUNK):
                    size = out.tell() + len(chunk)
                    if size > max_bytes:
                        raise ValueError(f"over {max_bytes} bytes; the limit is batch.max_file_bytes={max_bytes}")
                    if room is not None and size > room:
                        raise QuotaError(f"tenant {tenant!r} stores {used} bytes already; with this "
                                         f"file it would pass batch.tenant_quota_bytes={quota_bytes}")
                    out.write(chunk)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        expires_at = int(time.time()) + expires_after_s if expires_after_s is not None else None
        return self.seal_file(file_id, safe_filename(filename), purpose, tenant, expires_at)

    def seal_file(self, file_id: str, filename: str, purpose: str, tenant: str,
                  expires_at: int | None = None) -> dict[str, Any]:
        """The file's bytes are final: describe it (from now on it is listed and readable by its tenant)."""
        path = self.data_path(file_id)
        os.close(private(path))
        meta = {"id": file_id, "object": "file", "bytes": path.stat().st_size, "created_at": int(time.time()),
                "expires_at": expires_at, "filename": filename, "purpose": purpose, "status": "processed",
                "status_details": None, "kev": {"tenant": tenant}}
        _write_json(self.files_dir / f"{file_id}.json", meta)
        return meta

    def file(self, file_id: str, tenant: str | None = None) -> dict[str, Any] | None:
        """The file's record; None when unknown, expired (then deleted) or another tenant's."""
        meta = _read_json(self.files_dir / f"{file_id}.json") if _FILE_ID.match(file_id) else None
        if meta is not None and _is_expired(meta):
            self.delete_file(file_id)
            return None
        return meta if meta is not None and (tenant is None or owner(meta) == tenant) else None

    def files(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """The tenant's files (every file when tenant is None), newest first; expired ones are deleted."""
        found = [f for f in (self.file(p.stem) for p in self.files_dir.glob("file-*.json")) if f]
        mine = [f for f in found if tenant is None or owner(f) == tenant]
        return sorted(mine, key=lambda f: (f["created_at"], f["id"]), reverse=True)

    def usage(self, tenant: str) -> int:
        """Bytes the tenant's files take, batch outputs included (what batch.tenant_quota_bytes caps)."""
        return sum(f["bytes"] for f in self.files(tenant))

    def delete_file(self, file_id: str) -> bool:
        if not _FILE_ID.match(file_id):
            return False
        (self.files_dir / f"{file_id}.json").unlink(missing_ok=True)
        self.data_path(file_id).unlink(missing_ok=True)
        return True

    # --- batches ---------------------------------------------------------------
    @staticmethod
    def new_batch_id() -> str:
        return "batch_" + secrets.token_hex(12)

    def save_batch(self, record: dict[str, Any]) -> None:
        _write_json(self.batches_dir / f"{record['id']}.json", record)

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        return _read_json(self.batches_dir / f"{batch_id}.json") if _BATCH_ID.match(batch_id) else None

    def batches(self) -> list[dict[str, Any]]:
        """Newest first (every tenant's: BatchManager filters)."""
        found = [_read_json(p) for p in self.batches_dir.glob("batch_*.json")]
        return sorted((b for b in found if b), key=lambda b: (b["created_at"], b["id"]), reverse=True)


def public_file(meta: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI File object (Kev's bookkeeping left out)."""
    # status_details: a string when set, absent otherwise (OpenAI's schema has no null for it)
    return {key: value for key, value in meta.items()
            if key != "kev" and not (key == "status_details" and value is None)}


def owner(record: dict[str, Any]) -> str:
    """The tenant a file or batch record belongs to (records from before tenants: the default tenant)."""
    return str((record.get("kev") or {}).get("tenant", DEFAULT_TENANT))


def private(path: Path) -> int:
    """Open (create) path for writing, readable by its owner only; an existing file is made so too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def _is_expired(meta: dict[str, Any]) -> bool:
    return meta.get("expires_at") is not None and meta["expires_at"] <= time.time()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    with open(private(temporary), "w") as out:
        out.truncate()
        out.write(json.dumps(data))
    os.replace(temporary, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
