"""Validating a speech request body (single, batch item, WebSocket config) at the edge.

Every rejection is a `SpeechError` carrying the HTTP status, the message a client sees, the
offending `param` and a `code` to branch on; routes render it in the OpenAI error shape.
Fields of the vLLM-Omni contract that describe other models (`language`, `task_type`...) are
accepted and ignored, except the voice-cloning inputs (`ref_audio`, `ref_text`,
`speaker_embedding`, `task_type: Base`), which the loaded model cannot honour: Qwen3-Omni cannot
clone. `voice` names a built-in speaker or an uploaded voice; an uploaded voice speaks with the
built-in speaker it was matched to at upload (`uploaded_speaker`, voice_match.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from session_server.speech.encode import MAX_SPEED, MIN_SPEED, RESPONSE_FORMATS, SAMPLE_RATES, STREAMABLE_FORMATS
from session_server.speech.service import SpeechService

STREAM_FORMATS = ("sse", "audio")
VOICE_CLONING_UNSUPPORTED = "the loaded model does not support voice cloning"


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional field: null means the default, as if it were left out."""
    return {"anyOf": [schema, {"type": "null"}]}


# What `parse_speech` accepts, for the OpenAPI schema. The limits that depend on the profile
# (`speech.max_input_chars`, `speech.max_new_tokens`) and the model's voices are checked at run time.
SPEECH_FIELDS: dict[str, Any] = {
    "model": _or_null({"type": "string"}),
    "voice": _or_null({"type": "string", "description": "one of the model's voices or an uploaded voice (GET /v1/audio/voices)"}),
    "response_format": _or_null({"type": "string", "enum": list(RESPONSE_FORMATS)}),
    "speed": _or_null({"type": "number", "minimum": MIN_SPEED, "maximum": MAX_SPEED}),
    "sample_rate": _or_null({"type": "integer", "enum": list(SAMPLE_RATES)}),
    "instructions": _or_null({"type": "string"}),
    "max_new_tokens": _or_null({"type": "integer", "minimum": 1}),
    "seed": _or_null({"type": "integer", "minimum": 0, "maximum": 2**63 - 1}),
}
SPEECH_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "input": {"type": "string", "minLength": 1},
        **SPEECH_FIELDS,
        "stream": _or_null({"type": "boolean"}),
        "stream_format": _or_null({"type": "string", "enum": list(STREAM_FORMATS)}),
    },
    "additionalProperties": True,  # other vLLM-Omni fields (`language`, `task_type`...) are ignored
}


class SpeechError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type


@dataclass(frozen=True)
class SpeechParams:
    input: str
    voice: str
    response_format: str = "wav"
    speed: float = 1.0
    # None: the model's own rate.
    sample_rate: int | None = None
    instructions: str | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    # None: a whole file; "sse" or "audio": a streamed response.
    stream_format: str | None = None


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> SpeechError:
    return SpeechError(400, message, param, code)


def check_model(body: dict[str, Any], service: SpeechService) -> None:
    model = body.get("model")
    if model is None or model == "":
        return
    if not isinstance(model, str) or model not in (service.model_names or (service.runtime.model_id,)):
        raise SpeechError(404, f"The model `{model}` does not exist.", "model", "model_not_found")


def resolve_voice(voice: Any, service: SpeechService) -> str:
    voices = service.model_voices()
    if voice is None or voice == "":
        return voices.default
    if not isinstance(voice, str):
        raise bad("voice must be a string", "voice", "invalid_type")
    canonical = voices.canonical(voice)
    if canonical is not None:
        return canonical
    speaker = uploaded_speaker(voice, service)
    if speaker is not None:
        return speaker
    raise bad(f"Invalid voice '{voice}'. Supported voices: {', '.join(sorted(voices.names))}.", "voice", "invalid_voice")


def uploaded_speaker(name: str, service: SpeechService, param: str = "voice") -> str | None:
    """The built-in speaker the uploaded voice `name` speaks with (voice_match.py); None when no
    voice of that name is uploaded. Reads the registry, which may be shared (blocking: one listing)."""
    voice = service.registry().get(name)
    if voice is None:
        return None
    speaker = service.model_voices().canonical(voice.speaker) if voice.speaker else None
    if speaker is None:
        raise bad(
            f"Voice '{name}' has no matched speaker of the loaded model (it was uploaded by an older server, or for "
            "another model); upload it again to match it.",
            param,
            "voice_not_matched",
        )
    return speaker


def parse_speech(
    body: Any,
    service: SpeechService,
    *,
    streaming_allowed: bool = True,
    require_input: bool = True,
) -> SpeechParams:
    """Validate one request body. `require_input=False` for a WebSocket `session.config`."""
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object", None, "invalid_json")
    check_model(body, service)

    text = body.get("input", "")
    if not isinstance(text, str):
        raise bad("input must be a string", "input", "invalid_type")
    if require_input and not text.strip():
        raise bad("Input text cannot be empty", "input", "empty_input")
    if len(text) > service.config.max_input_chars:
        raise bad(f"Input text is longer than {service.config.max_input_chars} characters", "input", "input_too_long")

    for cloning_field in ("ref_audio", "ref_text", "speaker_embedding"):
        if body.get(cloning_field):
            raise bad(f"`{cloning_field}` is not supported: {VOICE_CLONING_UNSUPPORTED}.", cloning_field, "voice_cloning_unsupported")
    if body.get("task_type") == "Base":
        raise bad(f"task_type 'Base' is not supported: {VOICE_CLONING_UNSUPPORTED}.", "task_type", "voice_cloning_unsupported")

    voice = resolve_voice(body.get("voice"), service)

    response_format = body.get("response_format")
    if response_format is None:  # only null is the default: false, 0 or "" is no format
        response_format = "wav"
    if response_format not in RESPONSE_FORMATS:
        raise bad(
            f"Unsupported response_format '{response_format}'. Supported: {', '.join(RESPONSE_FORMATS)}.", "response_format"
        )

    speed = body.get("speed", 1.0)
    if speed is None:
        speed = 1.0
    if isinstance(speed, bool) or not isinstance(speed, (int, float)):
        raise bad("speed must be a number", "speed", "invalid_type")
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise bad(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}", "speed")

    sample_rate = body.get("sample_rate")
    if sample_rate is not None and (isinstance(sample_rate, bool) or sample_rate not in SAMPLE_RATES):
        raise bad(f"sample_rate must be one of {', '.join(map(str, SAMPLE_RATES))}, got {sample_rate}", "sample_rate")

    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions must be a string", "instructions", "invalid_type")
    if instructions is not None and len(instructions) > service.config.max_input_chars:
        raise bad(f"instructions are longer than {service.config.max_input_chars} characters", "instructions", "input_too_long")

    max_new_tokens = body.get("max_new_tokens")
    if max_new_tokens is not None:
        limit = service.config.max_new_tokens
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= limit:
            raise bad(f"max_new_tokens must be an integer between 1 and {limit}", "max_new_tokens")

    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise bad("seed must be a non-negative integer", "seed")

    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise bad("stream must be a boolean", "stream", "invalid_type")
    stream_format = body.get("stream_format")
    if stream_format is not None and stream_format not in STREAM_FORMATS:
        raise bad(f"stream_format must be one of {', '.join(STREAM_FORMATS)}", "stream_format")
    # stream=true alone selects SSE; stream_format alone selects that streaming mode.
    if stream and stream_format is None:
        stream_format = "sse"
    if stream_format is not None:
        if not streaming_allowed:
            raise bad("Streaming is not available here", "stream", "streaming_unsupported")
        if response_format not in STREAMABLE_FORMATS:
            raise bad(
                f"Streaming requires response_format 'pcm' or 'wav', got '{response_format}'", "response_format", "streaming_unsupported"
            )
        if speed != 1.0:
            raise bad(f"Streaming requires speed 1.0, got {speed}", "speed", "streaming_unsupported")

    return SpeechParams(
        input=text,
        voice=voice,
        response_format=response_format,
        speed=float(speed),
        sample_rate=sample_rate,
        instructions=instructions or None,
        max_new_tokens=max_new_tokens,
        seed=seed,
        stream_format=stream_format,
    )
