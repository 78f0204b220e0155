"""The conversation as the client sees it: items, their wire shapes, and response objects.

Pure data and formatting, no state machine: `protocol.py` decides when items and responses
change; this module says what they look like on the wire (OpenAI Realtime GA shapes).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from graph.messages import AddItem, Usage
from session_server.realtime import events as ev
from session_server.realtime.audio_formats import AudioFormat, InvalidAudio, decode
from session_server.realtime.events import RealtimeError


@dataclass
class Item:
    """A conversation item: a `message` (role + content), a `function_call` the model made (or the
    client added), or a `function_call_output` the client sent back."""

    id: str
    role: str
    content: list[dict[str, Any]]
    status: str = "completed"
    response_id: str | None = None
    audio_ms: float = 0.0  # assistant audio sent to the client
    type: str = "message"
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        if self.type == "function_call":
            return {**wire, "call_id": self.call_id, "name": self.name, "arguments": self.arguments or ""}
        if self.type == "function_call_output":
            return {**wire, "call_id": self.call_id, "output": self.output or ""}
        return {**wire, "role": self.role, "content": self.content}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def usage_wire(usage: Usage) -> dict[str, Any]:
    return {
        "total_tokens": usage.total_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "input_token_details": {
            "text_tokens": usage.input_text_tokens,
            "audio_tokens": usage.input_audio_tokens,
            "image_tokens": usage.input_image_tokens,
            "cached_tokens": usage.cached_tokens,
        },
        "output_token_details": {"text_tokens": usage.output_text_tokens, "audio_tokens": usage.output_audio_tokens},
    }


def transcription_usage_wire(usage: dict[str, int]) -> dict[str, Any]:
    """A transcript's token usage (GA `type: "tokens"`): the context the pass read, its output."""
    input_tokens, output_tokens = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return {
        "type": "tokens",
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "input_token_details": {"text_tokens": int(usage.get("input_text_tokens", 0)),
                                "audio_tokens": int(usage.get("input_audio_tokens", 0))},
    }


def response_wire(
    session_id: str,
    response: Any,
    status: str,
    reason: str | None = None,
    usage: Usage | None = None,
    error: tuple[str, str] | None = None,
    error_type: str = "server_error",
) -> dict[str, Any]:
    settings = response.settings
    details: dict[str, Any] | None = None
    if status != "in_progress" and status != "completed":
        details = {"type": status, "reason": reason}
        if error is not None:
            details["error"] = {"type": error_type, "code": error[0], "message": error[1]}
    return {
        "object": "realtime.response",
        "id": response.id,
        "status": status,
        "status_details": details,
        "output": [] if status == "in_progress" else [item.to_wire() for item in response.output_items],
        "conversation_id": None if settings.out_of_band else f"conv_{session_id}",
        "output_modalities": list(settings.output_modalities),
        "max_output_tokens": "inf" if settings.max_output_tokens is None else settings.max_output_tokens,
        "audio": {"output": {"format": settings.output_format.to_wire(), "voice": settings.voice}},
        "usage": None if usage is None else usage_wire(usage),
        "metadata": settings.metadata,
    }


def item_content(item: ev.ItemParam, item_id: str, input_format: AudioFormat) -> tuple[AddItem, list[dict[str, Any]]]:
    """The dialog's `AddItem` and the wire content of a client-created message item."""
    texts: list[str] = []
    audio = []
    images: list[bytes] = []
    content: list[dict[str, Any]] = []
    allowed = {"user": {"input_text", "input_audio", "input_image"}, "system": {"input_text"}, "assistant": {"output_text", "text", "output_audio", "audio"}}
    for index, part in enumerate(item.content):
        param = f"item.content[{index}]"
        if part.type not in allowed[item.role or "user"]:
            raise RealtimeError("invalid_value", f"Content type {part.type!r} is not valid in a {item.role} message.", f"{param}.type")
        if part.type in ("input_text", "output_text", "text"):
            texts.append(part.text or "")
            content.append({"type": part.type, "text": part.text or ""})
        elif part.type in ("output_audio", "audio"):
            texts.append(part.transcript or "")
            content.append({"type": "output_audio", "transcript": part.transcript or ""})
        elif part.type == "input_audio":
            data = decode_base64(part.audio or "", f"{param}.audio")
            try:
                audio.append(decode(data, input_format))
            except InvalidAudio as exc:
                raise RealtimeError("invalid_audio", str(exc), f"{param}.audio") from None
            content.append({"type": "input_audio", "transcript": part.transcript})
        else:  # input_image: a data URL
            url = part.image_url or ""
            if not url.startswith("data:image/") or ";base64," not in url:
                raise RealtimeError("invalid_image", "input_image needs a base64 data URL (data:image/png;base64,...).", f"{param}.image_url")
            images.append(decode_base64(url.split(";base64,", 1)[1], f"{param}.image_url"))
            content.append({"type": "input_image", "image_url": None, "detail": part.detail or "auto"})
    command = AddItem(item_id=item_id, role=item.role or "user", text="\n".join(texts) if texts else None, images=tuple(images))
    if audio:
        command.audio = np.concatenate(audio)
        command.sample_rate = input_format.rate
    return command, content


def decode_base64(text: str, param: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_base64", f"`{param}` is not valid base64.", param) from None
