"""GET/POST /v1/audio/voices and DELETE /v1/audio/voices/{name}.

`voices` lists the loaded model's built-in speakers; `uploaded_voices` lists the registry (see
`voice_registry.py`). A speech request or a realtime session may name either. Qwen3-Omni cannot
clone a voice: an upload is matched to the nearest built-in speaker (`voice_match.py`), named in
the upload's response and in its listing (`"speaker": "ethan"`), and that speaker speaks whenever
the uploaded name is used. Making the built-in speakers' signatures runs each speaker once through
the speech service, at the first upload of a process; if the graph cannot (full, failing), the
upload gets 503 `voice_matching_unavailable` and changes nothing. A voice stored by a version
without matching has no `speaker`: using it gets 400 `voice_not_matched` until it is uploaded again.

Upload (multipart): `audio_sample` (a file of at most `speech.voice_max_bytes`, 10 MiB; larger
gets 413 before it is decoded), `consent`, `name`, optional `ref_text` and
`speaker_description`. Undecodable audio, or audio shorter or longer than the configured bounds,
gets 400 `invalid_audio` and changes nothing; decoding stops as soon as the audio passes
`speech.voice_max_s`, so a small file that holds hours of audio costs no more than the limit.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from session_server.errors import openai_error_response
from session_server.request_body import declared_body
from session_server.speech.encode import AudioTooLong, decode_audio
from session_server.speech.params import SpeechError
from session_server.speech.routes import ensure_available, error_response
from session_server.speech.service import SessionRejected, SpeechFailed, SpeechService
from session_server.speech.voice_registry import VoiceError

log = logging.getLogger("session_server.speech")

# Multipart overhead allowed on top of the audio file itself before the body is refused unread.
VOICE_FORM_OVERHEAD = 64 * 1024


def voice_error(error: VoiceError) -> Response:
    return openai_error_response(error.status, error.message, "invalid_request_error", error.param, error.code)


def _too_large(limit: int) -> Response:
    return openai_error_response(
        413, f"audio_sample is larger than {limit // (1024 * 1024)} MiB", "invalid_request_error", "audio_sample", "file_too_large"
    )


def _media_type(declared: str | None, filename: str | None, data: bytes) -> str:
    """The upload's media type: as declared, else from its first bytes, else from its file name."""
    if declared and declared not in ("application/octet-stream", "binary/octet-stream"):
        return declared
    for magic, media_type in _MAGIC:
        if data.startswith(magic):
            return media_type
    if data[4:8] == b"ftyp":
        return "audio/mp4"
    guessed, _ = mimetypes.guess_type(filename or "")
    return guessed or "application/octet-stream"


_MAGIC = (
    (b"RIFF", "audio/wav"),
    (b"fLaC", "audio/flac"),
    (b"OggS", "audio/ogg"),
    (b"ID3", "audio/mpeg"),
    (b"\xff\xfb", "audio/mpeg"),
    (b"\xff\xf3", "audio/mpeg"),
    (b"\xff\xf1", "audio/aac"),
    (b"\xff\xf9", "audio/aac"),
    (b"\x1a\x45\xdf\xa3", "audio/webm"),
)


def _form_text(form, key: str) -> str | None:
    value = form.get(key)
    if value is None or isinstance(value, UploadFile):
        return None
    return str(value)


VOICE_UPLOAD_SCHEMA = {
    "type": "object",
    "required": ["name", "consent", "audio_sample"],
    "properties": {
        "name": {"type": "string"},
        "consent": {"type": "string", "minLength": 1},
        "audio_sample": {"type": "string", "format": "binary", "description": "an audio file of `speech.voice_min_s` to `speech.voice_max_s` (1 to 60 s)"},
        "ref_text": {"type": "string"},
        "speaker_description": {"type": "string"},
    },
}


def install_voice_routes(app: FastAPI, service: SpeechService) -> None:
    @app.get("/v1/audio/voices")
    async def list_voices() -> Response:
        try:
            ensure_available(service)
        except SpeechError as error:
            return error_response(error)
        uploaded = service.registry().list()
        return JSONResponse(
            {"voices": sorted(service.model_voices().names), "uploaded_voices": [voice.public() for voice in uploaded]}
        )

    @app.post("/v1/audio/voices", openapi_extra=declared_body({"multipart/form-data": VOICE_UPLOAD_SCHEMA}))
    async def upload_voice(request: Request) -> Response:
        try:
            ensure_available(service)
        except SpeechError as error:
            return error_response(error)
        limit = service.config.voice_max_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit + VOICE_FORM_OVERHEAD:
            return _too_large(limit)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            return openai_error_response(400, "Upload a voice as multipart/form-data", "invalid_request_error", None, "invalid_content_type")
        try:
            form = await request.form(max_files=1, max_fields=8)
        except Exception as exc:  # noqa: BLE001 - any malformed form is the client's error
            return openai_error_response(400, f"Malformed multipart form: {exc}", "invalid_request_error", None, "invalid_form")
        try:
            upload = form.get("audio_sample")
            name = _form_text(form, "name")
            consent = _form_text(form, "consent")
            if not isinstance(upload, UploadFile):
                return openai_error_response(400, "audio_sample (a file) is required", "invalid_request_error", "audio_sample", "missing_field")
            if name is None:
                return openai_error_response(400, "name is required", "invalid_request_error", "name", "missing_field")
            if consent is None or not consent.strip():
                return openai_error_response(400, "consent is required", "invalid_request_error", "consent", "missing_field")
            data = await upload.read(limit + 1)
            if len(data) > limit:
                return _too_large(limit)
            try:
                samples, rate = await asyncio.to_thread(decode_audio, data, service.config.voice_max_s)
            except AudioTooLong as exc:
                return openai_error_response(400, f"Audio sample is too long ({exc})", "invalid_request_error", "audio_sample", "invalid_audio")
            except ValueError as exc:
                return openai_error_response(400, f"audio_sample is not decodable audio ({exc})", "invalid_request_error", "audio_sample", "invalid_audio")
            try:
                service.registry().check_upload(name=name, consent=consent, samples=samples, sample_rate=rate)
            except VoiceError as error:
                return voice_error(error)
            try:
                speaker = await service.matcher.nearest(samples, rate)
            except (SessionRejected, SpeechFailed) as exc:
                log.warning("voice %r: the built-in speakers' signatures could not be made: %s", name, exc)
                return openai_error_response(
                    503, f"The voice could not be matched to a speaker now ({exc}); try again.", "server_error", None, "voice_matching_unavailable"
                )
            try:
                voice, replaced = await asyncio.to_thread(
                    service.registry().add,
                    name=name,
                    consent=consent,
                    samples=samples,
                    sample_rate=rate,
                    mime_type=_media_type(upload.content_type, upload.filename, data),
                    file_size=len(data),
                    ref_text=_form_text(form, "ref_text"),
                    speaker_description=_form_text(form, "speaker_description"),
                    speaker=speaker,
                )
            except VoiceError as error:
                return voice_error(error)
        finally:
            await form.close()
        log.info("voice %r %s (%d bytes, %.2f s), speaks as %r", voice.name, "replaced" if replaced else "uploaded", voice.file_size,
                 voice.duration_s, voice.speaker)
        return JSONResponse({"success": True, "voice": voice.public()})

    @app.delete("/v1/audio/voices/{name}")
    async def delete_voice(name: str) -> Response:
        try:
            ensure_available(service)
        except SpeechError as error:
            return error_response(error)
        try:
            await asyncio.to_thread(service.registry().delete, name)
        except VoiceError as error:
            return voice_error(error)
        return JSONResponse({"success": True, "message": f"Voice '{name}' deleted successfully"})
