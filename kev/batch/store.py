"""BatchStore: the Files and Batches API's state on disk (batch.dir), so a restarted server finds it all again.

    files/<file_id>.data    the bytes (an output file grows here while its batch runs)
    files/<file_id>.json    the OpenAI File object; written when the file is complete
    batches/<batch_id>.json the OpenAI Batch object, plus Kev's own "kev" key (its output files)

Objects are replaced atomically (write a temporary file, then rename), so a kill leaves the
old version or the new one, never half of one.
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

_FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
_BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")


class BatchStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.files_dir, self.batches_dir = self.root / "files", self.root / "batches"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.batches_dir.mkdir(parents=True, exist_ok=True)

    # --- files -----------------------------------------------------------------
    @staticmethod
    def new_file_id() -> str:
        return "file-" + uuid.uuid4().hex[:24]

    def data_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.data"

    def add_file(self, data: bytes, filename: str, purpose: str) -> dict[str, Any]:
        file_id = self.new_file_id()
        self.data_path(file_id).write_bytes(data)
        return self.seal_file(file_id, filename, purpose)

    def seal_file(self, file_id: str, filename: str, purpose: str) -> dict[str, Any]:
        """The file's bytes are final: describe it (from now on it is listed and readable)."""
        path = self.data_path(file_id)
        if not path.exists():
            path.touch()
        meta = {"id": file_id, "object": "file", "bytes": path.stat().st_size, "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed", "status_details": None}
        _write_json(self.files_dir / f"{file_id}.json", meta)
        return meta

    def file(self, file_id: str) -> dict[str, Any] | None:
        return _read_json(self.files_dir / f"{file_id}.json") if _FILE_ID.match(file_id) else None

    def files(self) -> list[dict[str, Any]]:
        found = [_read_json(p) for p in self.files_dir.glob("file-*.json")]
        return sorted((f for f in found if f), key=lambda f: (f["created_at"], f["id"]), reverse=True)

    def delete_file(self, file_id: str) -> bool:
        if self.file(file_id) is None:
            return False
        (self.files_dir / f"{file_id}.json").unlink(missing_ok=True)
        self.data_path(file_id).unlink(missing_ok=True)
        return True

    # --- batches ---------------------------------------------------------------
    @staticmethod
    def new_batch_id() -> str:
        return "batch_" + uuid.uuid4().hex[:24]

    def save_batch(self, record: dict[str, Any]) -> None:
        _write_json(self.batches_dir / f"{record['id']}.json", record)

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        return _read_json(self.batches_dir / f"{batch_id}.json") if _BATCH_ID.match(batch_id) else None

    def batches(self) -> list[dict[str, Any]]:
        """Newest first."""
        found = [_read_json(p) for p in self.batches_dir.glob("batch_*.json")]
        return sorted((b for b in found if b), key=lambda b: (b["created_at"], b["id"]), reverse=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
