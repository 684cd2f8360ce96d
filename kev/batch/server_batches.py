"""BatchManager: the batches of `kev serve` (/v1/batches), each an asyncio task on the server's backend.

A batch's life is OpenAI's: validating -> in_progress -> completed, or failed (an invalid line:
nothing runs), or cancelling -> cancelled. Its record and its output files are on disk
(BatchStore); output lines are appended as answers finish, so a server that restarts, even
after a SIGKILL, picks every unfinished batch up again and runs only what its output lacks.
A shutdown stops the tasks without writing what was cut short.
"""
from __future__ import annotations

import asyncio
import builtins
import json  # BatchManager.list (the route's verb) shadows the type inside the class
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from kev.batch.input_file import LineError, read_lines
from kev.batch.local_backend import default_max_inflight
from kev.batch.output_file import OutputFile, resume
from kev.batch.records import is_failure
from kev.batch.requests import BatchRequest, RequestBuilder, build_all
from kev.batch.runner import BatchRunner
from kev.batch.store import BatchStore, owner
from kev.backend.bridge import EngineBridge
from kev.errors import describe_os_error

if TYPE_CHECKING:
    from kev.server.service import KevService

log = logging.getLogger("kev.batch")
WINDOW_S = 24 * 3600
SAVE_EVERY_S = 0.25  # progress (request_counts) reaches disk at most this often while a batch runs
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")


class BatchManager:
    def __init__(self, service: KevService, store: BatchStore) -> None:
        self.service, self.store = service, store
        self.builder = RequestBuilder.from_config(service.config)
        self.max_inflight = default_max_inflight(service.config)
        self.max_requests = service.config.batch.max_requests
        self.quota_bytes = service.config.batch.tenant_quota_bytes
        self._unsealed: Counter[str] = Counter()  # per tenant: output bytes of running batches, not yet in usage()
        self._live: dict[str, dict[str, Any]] = {}  # running batches: their record, the one copy that changes
        self._stops: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """On the event loop: pick up every batch a previous server left unfinished (and delete expired files)."""
        self.store.files()  # reading a file's record deletes it once expired (OpenAI's expires_after)
        for record in self.store.batches():
            if record["status"] in UNFINISHED:
                log.info("batch %s: resuming (%s)", record["id"], record["status"])
                self._spawn(record)

    def create(self, input_file_id: str, endpoint: str, metadata: dict[str, str] | None,
               tenant: str) -> dict[str, Any]:
        now = int(time.time())
        record: dict[str, Any] = {
            "id": self.store.new_batch_id(), "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": "24h", "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
            "expires_at": now + WINDOW_S, "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata,
            "kev": {"output": self.store.new_file_id(), "errors": self.store.new_file_id(), "tenant": tenant}}
        self.store.save_batch(record)
        self._spawn(record)
        return record

    def get(self, batch_id: str, tenant: str) -> dict[str, Any] | None:
        """The batch, if it is the tenant's (another tenant's is as unknown as a made-up id)."""
        record = self._live.get(batch_id) or self.store.batch(batch_id)
        return record if record is not None and owner(record) == tenant else None

    def list(self, tenant: str) -> list[dict[str, Any]]:
        return [self._live.get(b["id"], b) for b in self.store.batches() if owner(b) == tenant]

    def cancel(self, batch_id: str, tenant: str) -> dict[str, Any] | None:
        """A running batch turns `cancelling` and stops; what finished stays in its output."""
        record = self.get(batch_id, tenant)
        if record is None or record["status"] not in UNFINISHED or record["status"] == "cancelling":
            return record
        record.update(status="cancelling", cancelling_at=int(time.time()))
        self.store.save_batch(record)
        if batch_id in self._stops:
            self._stops[batch_id].set()
        return record

    async def shutdown(self) -> None:
        """Stop every running batch where it is; its record stays unfinished, so the next server resumes it."""
        for stop in self._stops.values():
            stop.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- one batch -----------------------------------------------------------------------
    def _spawn(self, record: dict[str, Any]) -> None:
        self._live[record["id"]] = record
        self._stops[record["id"]] = stop = asyncio.Event()
        if record["status"] == "cancelling":
            stop.set()
        task = asyncio.create_task(self._run(record, stop))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._ended(record["id"], t))

    def _ended(self, batch_id: str, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._live.pop(batch_id, None)
        self._stops.pop(batch_id, None)

    async def _run(self, record: dict[str, Any], stop: asyncio.Event) -> None:
        try:
            requests, errors = self._read(record)
            if errors:
                return self._finish(record, "failed", errors)
            if record["status"] == "validating":
                record.update(status="in_progress", in_progress_at=int(time.time()))
                record["request_counts"]["total"] = len(requests)
                self.store.save_batch(record)
            remaining = self._resume(record, requests)
            if record["status"] != "cancelling" and remaining:
                await self._answer(record, remaining, stop)
            if (over := record["kev"].pop("over_quota", None)) is not None:
                self._finish(record, "failed", [LineError(0, None, "batch.tenant_quota_bytes", over)], seal=True)
            elif (refused := record["kev"].pop("os_error", None)) is not None:
                self._fail_on_os_error(record, refused)
            elif record["status"] == "cancelling":
                self._finish(record, "cancelled")
            elif not stop.is_set():
                self._finish(record, "completed")
            else:
                self.store.save_batch(record)  # a shutdown: left in_progress for the next server
        except OSError as err:  # the batch folder refused a read or write (full, read-only): one line, no traceback
            self._fail_on_os_error(record, describe_os_error(err))
        except Exception as err:
            log.exception("batch %s failed", record["id"])
            self._finish(record, "failed", [LineError(0, None, None, f"internal error: {err!r}")])

    def _fail_on_os_error(self, record: dict[str, Any], message: str) -> None:
        """The batch fails with one line naming the path and what to do (describe_os_error); what it answered is
        sealed (readable), as at the quota. If even that cannot be written, its record on disk stays unfinished:
        the next start resumes it."""
        log.error("batch %s failed: %s", record["id"], message)
        try:
            self._finish(record, "failed", [LineError(0, None, None, message)], seal=True)
        except OSError as again:
            log.error("batch %s: its failure could not be recorded (%s); the next start resumes it",
                      record["id"], describe_os_error(again))

    def _read(self, record: dict[str, Any]) -> tuple[builtins.list[BatchRequest], builtins.list[LineError]]:
        """Validating: every line of the input file must be a request to the batch's endpoint."""
        path = self.store.data_path(record["input_file_id"])
        if self.store.file(record["input_file_id"], owner(record)) is None:
            return [], [LineError(0, None, "input_file_id", f"{record['input_file_id']!r} no longer exists")]
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            return [], [LineError(0, None, "input_file_id", f"not UTF-8 text ({err.reason} at byte {err.start})")]
        lines, errors = read_lines(text.split("\n"), "jsonl")
        for line in lines:
            if line.url != record["endpoint"]:
                errors.append(LineError(line.line_no, line.custom_id, "url",
                                        f"{line.url!r} differs from the batch's endpoint {record['endpoint']!r}"))
        requests, invalid = build_all([line for line in lines if line.url == record["endpoint"]], self.builder)
        errors = sorted(errors + invalid, key=lambda e: e.line_no)
        if not errors and not requests:
            errors = [LineError(0, None, "input_file_id", "the input file holds no request")]
        if len(requests) > self.max_requests:
            errors = [LineError(0, None, "input_file_id", f"{len(requests)} requests; the limit is "
                                                          f"batch.max_requests={self.max_requests}")]
        return requests, errors

    def _resume(self, record: dict[str, Any], requests: builtins.list[BatchRequest]) -> builtins.list[BatchRequest]:
        """What the output files already answer is not run again; request_counts are recounted from them."""
        done = resume(self.store.data_path(record["kev"]["output"]))
        failed = resume(self.store.data_path(record["kev"]["errors"]))
        counts = record["request_counts"]
        counts["completed"], counts["failed"] = len(done.keys), len(failed.keys)
        keys = done.keys | failed.keys
        return [r for r in requests if r.custom_id not in keys]

    async def _answer(self, record: dict[str, Any], requests: builtins.list[BatchRequest], stop: asyncio.Event) -> None:
        backend = await self._backend(stop)
        if backend is None:
            return
        outputs = OutputFile(self.store.data_path(record["kev"]["output"]))
        failures = OutputFile(self.store.data_path(record["kev"]["errors"]))
        saved = [time.monotonic()]

        tenant, written = owner(record), [0]

        def emit(_: BatchRequest, line: dict[str, Any]) -> None:
            size = len((json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
            if self.quota_bytes is not None and (record["kev"].get("over_quota") or self.store.usage(tenant)
                                                 + self._unsealed[tenant] + size > self.quota_bytes):
                # batch outputs count in the tenant's quota as uploads do: the line that would pass it is not
                # written, the batch stops and fails naming the limit; what it answered stays readable
                record["kev"]["over_quota"] = (f"the output would take tenant {tenant!r} past "
                                               f"batch.tenant_quota_bytes={self.quota_bytes}; "
                                               f"{sum(record['request_counts'][k] for k in ('completed', 'failed'))} "
                                               "lines were answered")
                stop.set()
                return
            failed = is_failure(line)
            try:
                (failures if failed else outputs).write(line)
            except OSError as err:  # a full disk: the torn line is cut off (OutputFile); stop, fail naming the file
                record["kev"]["os_error"] = describe_os_error(err)
                stop.set()
                return
            self._unsealed[tenant] += size
            written[0] += size
            record["request_counts"]["failed" if failed else "completed"] += 1
            if time.monotonic() - saved[0] > SAVE_EVERY_S:
                self.store.save_batch(record)
                saved[0] = time.monotonic()

        try:
            runner = BatchRunner(backend, self.builder.model_name, self.max_inflight, tenant=owner(record),
                                 work_class="batch")
            await runner.run(requests, emit, stop)
        finally:
            outputs.close()
            failures.close()
            self._unsealed[tenant] -= written[0]  # sealed next, into usage()

    async def _backend(self, stop: asyncio.Event) -> EngineBridge | None:
        """The server's backend once it is ready (the model may still be loading after a restart)."""
        while not stop.is_set():
            if self.service.is_ready and self.service.backend is not None:
                return self.service.backend
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except TimeoutError:
                pass
        return None

    def _finish(self, record: dict[str, Any], status: str, errors: builtins.list[LineError] | None = None,
                seal: bool = False) -> None:
        """seal: a failed batch keeps what it answered (it stopped at the tenant's quota)."""
        now = int(time.time())
        record["status"] = status
        if status == "failed":
            record.update(failed_at=now, errors={"object": "list", "data": [
                {"code": "invalid_request", "message": str(e) if e.line_no else
                 (f"{e.field}: " if e.field else "") + e.message, "param": e.field, "line": e.line_no or None}
                for e in (errors or [])[:100]]})
        if status != "failed" or seal:
            if status != "failed":
                record.update(finalizing_at=now, **{f"{status}_at": now})
            record["output_file_id"] = self.store.seal_file(record["kev"]["output"], f"{record['id']}_output.jsonl",
                                                            "batch_output", owner(record))["id"]
            if record["request_counts"]["failed"]:
                record["error_file_id"] = self.store.seal_file(record["kev"]["errors"], f"{record['id']}_error.jsonl",
                                                               "batch_output", owner(record))["id"]
        self.store.save_batch(record)
        log.info("batch %s %s: %s", record["id"], status, record["request_counts"])


def public(record: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI Batch object (Kev's bookkeeping left out; a time or file not reached yet is absent, not null, as
    OpenAI's schema has no null for them)."""
    return {key: value for key, value in record.items() if key != "kev" and (value is not None or key == "metadata")}
