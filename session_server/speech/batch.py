"""POST /v1/audio/speech/batch: 1..32 texts in one request, results as JSON with base64 audio.

Batch-level fields are defaults; an item's own fields override them. Items are validated and
synthesised one by one, so a bad item fails alone: the response is still 200, the failed item
carries `index`, `status: "error"` and `error`, the others `status: "success"`, the audio,
its media type and `usage`. Results are in input order.

Items run concurrently (at most `speech.batch_concurrency` at once per batch), each as its own
speech request on the graph, so the shared executors batch them together with everything else
(and below the live sessions, see `service.py`). Streaming fields are refused per item. A client
that disconnects cancels every item still running.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from graph.errors import SessionRejected
from session_server.speech import encode
from session_server.request_body import declared_body
from session_server.speech.params import SpeechError, check_model, parse_speech
from session_server.speech.routes import ensure_available, error_response, read_json, synthesize_clip, wait_for_disconnect
from session_server.speech.service import SpeechFailed, SpeechService, usage_body

MAX_BATCH_ITEMS = 32
# Batch-level defaults an item inherits unless it sets the field itself.
INHERITED = (
    "voice",
    "response_format",
    "speed",
    "sample_rate",
    "instructions",
    "max_new_tokens",
    "seed",
    "language",
    "task_type",
    "ref_audio",
    "ref_text",
)
# Items and the defaults they inherit are checked item by item: a bad one gets its own
# `status: "error"` entry in a 200 answer, so the schema constrains only the batch itself.
_ITEM = {"description": "a speech request (as for POST /v1/audio/speech, without streaming)", "example": {"input": "Hello."}}
BATCH_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["items"],
    "properties": {
        "model": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "items": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_ITEMS, "items": _ITEM},
        **{field: {"description": "the default for every item that does not set it"} for field in INHERITED},
    },
    "additionalProperties": True,
}


async def run_item(service: SpeechService, index: int, fields: dict[str, Any]) -> dict[str, Any]:
    try:
        params = parse_speech(fields, service, streaming_allowed=False)
        audio, job = await synthesize_clip(service, params)
    except SpeechError as error:
        return {"index": index, "status": "error", "error": error.message}
    except (SessionRejected, SpeechFailed) as exc:
        return {"index": index, "status": "error", "error": exc.message}
    return {
        "index": index,
        "status": "success",
        "audio_data": base64.b64encode(audio).decode("ascii"),
        "media_type": encode.MEDIA_TYPES[params.response_format],
        "usage": usage_body(job.usage),
    }


def install_batch_route(app: FastAPI, service: SpeechService) -> None:
    @app.post("/v1/audio/speech/batch", openapi_extra=declared_body({"application/json": BATCH_REQUEST_SCHEMA}))
    async def create_speech_batch(request: Request) -> Response:
        try:
            ensure_available(service)
            body = await read_json(request)
            if not isinstance(body, dict):
                raise SpeechError(400, "The request body must be a JSON object", None, "invalid_json")
            check_model(body, service)
            items = body.get("items")
            if not isinstance(items, list) or not items:
                raise SpeechError(400, "items must be a non-empty list (1 to 32 items)", "items", "invalid_value")
            if len(items) > MAX_BATCH_ITEMS:
                raise SpeechError(
                    400, f"A batch holds at most {MAX_BATCH_ITEMS} items, got {len(items)}", "items", "too_many_items"
                )
        except SpeechError as error:
            return error_response(error)

        defaults = {key: body[key] for key in INHERITED if body.get(key) is not None}
        limit = asyncio.Semaphore(max(1, service.config.batch_concurrency))

        async def bounded(index: int, item: Any) -> dict[str, Any]:
            if not isinstance(item, dict):
                return {"index": index, "status": "error", "error": "Each item must be a JSON object with `input`"}
            fields = defaults | {key: value for key, value in item.items() if value is not None}
            if "model" in body:
                fields.setdefault("model", body["model"])
            async with limit:
                return await run_item(service, index, fields)

        work = asyncio.ensure_future(asyncio.gather(*(bounded(i, item) for i, item in enumerate(items))))
        disconnect = asyncio.create_task(wait_for_disconnect(request))
        try:
            await asyncio.wait({work, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()  # the handler itself was cancelled (server shutdown): stop the work too
            raise
        finally:
            disconnect.cancel()
        if not work.done():  # the client left: cancel every item (their graph sessions close)
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return Response(status_code=499)
        results = work.result()
        succeeded = sum(1 for r in results if r["status"] == "success")
        return JSONResponse(
            {
                "id": f"speech-batch-{uuid.uuid4().hex[:24]}",
                "results": list(results),
                "total": len(results),
                "succeeded": succeeded,
                "failed": len(results) - succeeded,
            }
        )
