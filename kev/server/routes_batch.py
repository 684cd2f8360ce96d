"""OpenAI's Files and Batches API (/v1/files, /v1/batches): the official client's batch calls work unchanged.

Files and batch records live on disk under batch.dir (kev/batch/store.py); the batches run
on the server's own backend (kev/batch/server_batches.py). Auth is the gate's, as for every route;
each file and batch is its tenant's: another tenant's id is a 404, as an unknown one.
"""
from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Query, Request, UploadFile
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from kev.batch.input_file import URLS
from kev.batch.server_batches import BatchManager, public
from kev.batch.store import QuotaError, public_file, safe_filename
from kev.wire.bodies.errors import ApiError
from kev.server.errors import error_responses
from kev.server.query_params import one_value_each
from kev.config.tenants import Caller, caller_of

router = APIRouter(tags=["batch"], dependencies=[Depends(one_value_each)])
_ERRORS = error_responses(400, 401, 404, 413, 422, 503)


def get_batches(request: Request) -> BatchManager:
    return request.app.state.batches


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: str
    endpoint: str = Field(description=f"one of {', '.join(URLS)}")
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None


# --- files ----------------------------------------------------------------------------
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 2_592_000  # OpenAI's bounds on expires_after[seconds]
_ANCHOR, _SECONDS = "expires_after[anchor]", "expires_after[seconds]"


class FileForm(BaseModel):
    """The multipart form of an upload (File(): multipart, as the upload needs); its schema says every rule."""

    # expires_after comes whole or not at all: each of its two fields requires the other.
    model_config = ConfigDict(json_schema_extra={"dependentRequired": {_ANCHOR: [_SECONDS], _SECONDS: [_ANCHOR]}})

    file: UploadFile
    purpose: Literal["batch"] = Field(description="only 'batch' is taken here")
    # Absent, never null: a form field has no null.
    anchor: Literal["created_at"] = Field(None, alias=_ANCHOR)  # type: ignore[arg-type]
    seconds: int = Field(None, alias=_SECONDS, ge=MIN_EXPIRY_S, le=MAX_EXPIRY_S)  # type: ignore[assignment]


@router.post("/v1/files", responses=_ERRORS, summary="Upload a batch input file (JSONL, purpose=batch)")
async def create_file(form: Annotated[FileForm, File()], batches: BatchManager = Depends(get_batches),
                      caller: Caller = Depends(caller_of)) -> dict[str, Any]:
    """The upload was spooled to a temporary file as it arrived; here it is copied to the store off the loop."""
    config = batches.service.config.batch
    file = form.file
    try:
        meta = await asyncio.to_thread(batches.store.add_file, file.file, file.filename or "upload.jsonl",
                                       form.purpose, caller.tenant, config.max_file_bytes, config.tenant_quota_bytes,
                                       _expiry(form, config.default_file_expiry_s))
    except ValueError as err:
        raise ApiError(413, f"file: {err}", "file") from None
    except QuotaError as err:
        raise ApiError(413, f"file: {err}", "file") from None
    return public_file(meta)


def _expiry(form: FileForm, default_s: int | None) -> int | None:
    """OpenAI's expires_after (its values checked by FileForm); without it batch.default_file_expiry_s."""
    if form.anchor is None and form.seconds is None:
        return default_s
    if form.seconds is None:
        raise ApiError(422, f"{_SECONDS}: is required with {_ANCHOR}", _SECONDS)
    if form.anchor is None:
        raise ApiError(422, f"{_ANCHOR}: is required with {_SECONDS}", _ANCHOR)
    return form.seconds


@router.get("/v1/files", responses=error_responses(401), summary="The caller's files, newest first")
async def list_files(batches: BatchManager = Depends(get_batches),
                     caller: Caller = Depends(caller_of)) -> dict[str, Any]:
    files = [public_file(f) for f in batches.store.files(caller.tenant)]
    return {"object": "list", "data": files, "first_id": files[0]["id"] if files else None,
            "last_id": files[-1]["id"] if files else None, "has_more": False}


@router.get("/v1/files/{file_id}", responses=error_responses(401, 404), summary="A file's description")
async def retrieve_file(file_id: str, batches: BatchManager = Depends(get_batches),
                        caller: Caller = Depends(caller_of)) -> dict[str, Any]:
    return public_file(_file(batches, file_id, caller))


@router.get("/v1/files/{file_id}/content", responses=error_responses(401, 404), summary="A file's bytes")
async def file_content(file_id: str, batches: BatchManager = Depends(get_batches),
                       caller: Caller = Depends(caller_of)) -> FileResponse:
    meta = _file(batches, file_id, caller)
    return FileResponse(batches.store.data_path(file_id), media_type="application/jsonl",
                        filename=safe_filename(meta["filename"]))


@router.delete("/v1/files/{file_id}", responses=error_responses(401, 404), summary="Delete a file")
async def delete_file(file_id: str, batches: BatchManager = Depends(get_batches),
                      caller: Caller = Depends(caller_of)) -> dict[str, Any]:
    _file(batches, file_id, caller)
    batches.store.delete_file(file_id)
    return {"id": file_id, "object": "file", "deleted": True}


def _file(batches: BatchManager, file_id: str, caller: Caller) -> dict[str, Any]:
    meta = batches.store.file(file_id, caller.tenant)
    if meta is None:  # another tenant's answers the same: existence is not revealed
        raise ApiError(404, f"file_id: {file_id!r} is unknown", "file_id")
    return meta


# --- batches --------------------------------------------------------------------------
@router.post("/v1/batches", responses=_ERRORS, summary="Run every request of an uploaded file; returns at once")
async def create_batch(body: BatchBody, batches: BatchManager = Depends(get_batches),
                       caller: Caller = Depends(caller_of)) -> dict[str, Any]:
    if batches.service.load_error:
        raise ApiError(503, f"model failed to load: {batches.service.load_error}", None)
    meta = batches.store.file(body.input_file_id, caller.tenant)
    if meta is None:
        raise ApiError(404, f"input_file_id: {body.input_file_id!r} is unknown", "input_file_id")
    if meta["purpose"] != "batch":
        raise ApiError(422, f"input_file_id: {body.input_file_id!r} has purpose {meta['purpose']!r}, not 'batch'",
                       "input_file_id")
    if body.endpoint not in URLS:
        raise ApiError(422, f"endpoint: {body.endpoint!r} is not supported (one of {', '.join(URLS)})", "endpoint")
    return public(batches.create(body.input_file_id, body.endpoint, body.metadata, caller.tenant))


@router.get("/v1/batches", responses=error_responses(401, 422), summary="Batches, newest first")
async def list_batches(after: str | None = None, limit: Annotated[int, Query(ge=1, le=100)] = 20,
                       batches: BatchManager = Depends(get_batches),
                       caller: Caller = Depends(caller_of)) -> dict[str, Any]:
    records = batches.list(caller.tenant)
    if after is not None:
        ids = [r["id"] for r in records]
        records = records[ids.index(after) + 1:] if after in ids else []
    page = [public(r) for r in records[:limit]]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(records) > limit}


@router.get("/v1/batches/{batch_id}", responses=error_responses(401, 404), summary="A batch: status and request_counts")
async def retrieve_batch(batch_id: str, batches: BatchManager = Depends(get_batches),
                         caller: Caller = Depends(caller_of)) -> dict[str, Any]:
    return public(_batch(batches.get(batch_id, caller.tenant), batch_id))


@router.post("/v1/batches/{batch_id}/cancel", responses=error_responses(401, 404), summary="Stop a batch")
async def cancel_batch(batch_id: str, batches: BatchManager = Depends(get_batches),
                       caller: Caller = Depends(caller_of)) -> dict[str, Any]:
    return public(_batch(batches.cancel(batch_id, caller.tenant), batch_id))


def _batch(record: dict[str, Any] | None, batch_id: str) -> dict[str, Any]:
    if record is None:
        raise ApiError(404, f"batch_id: {batch_id!r} is unknown", "batch_id")
    return record
