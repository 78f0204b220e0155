"""What the loaded graph serves to a realtime session: the reply cap, the voices, the input bounds.

Read from the profile (the thinker's `max_reply_tokens`, the talker's `voices` aliases) and from the
loaded resources (the checkpoint's speakers), so that `session.created` shows the cap a reply really
has and `audio.output.voice` names the speaker that really speaks; and, from the speech package,
the lookup of uploaded voices (the registry another replica may have written), each of which speaks
with the built-in speaker it was matched to at upload.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from session_server.realtime.events import RealtimeError
from session_server.realtime.session_config import ServedModel
from session_server.speech.params import SpeechError
from session_server.state import ServerState

log = logging.getLogger(__name__)

# The thinker's own default when neither the node nor its resource names a cap (nodes/qwen3_omni/model.py).
_DEFAULT_REPLY_TOKENS = 2048


def served_model(state: ServerState) -> ServedModel:
    """The served model's facts, read once per server."""
    if state.served is not None:
        return state.served
    served = _read(state)
    if state.ready:
        state.served = served
    return served


def _read(state: ServerState) -> ServedModel:
    spec = state.runtime.spec
    cap: int | None = None
    aliases: dict[str, str] = {}
    resource_name: str | None = None
    for node in spec.nodes.values():
        if node.type.endswith(".thinker"):
            resource_name = node.params.get("resource", "omni")
            resource = spec.resources.get(resource_name)
            cap = node.params.get("max_reply_tokens") or (resource.params.get("max_reply_tokens") if resource else None)
            cap = int(cap or _DEFAULT_REPLY_TOKENS)
        elif node.type.endswith(".talker"):
            aliases = {str(k).lower(): str(v).lower() for k, v in (node.params.get("voices") or {}).items()}
            resource_name = resource_name or node.params.get("resource", "omni")
    resources: dict[str, Any] = state.runtime.resources if state.ready else {}
    resource = resources.get(resource_name or "") if resource_name else None
    speakers = tuple(getattr(resource, "speakers", None) or ())
    return ServedModel(
        model=state.settings.model_id,
        max_output_tokens=cap,
        speakers=speakers,
        default_speaker=getattr(resource, "default_speaker", None) if speakers else None,
        voice_aliases=aliases,
        max_text_tokens=spec.limits.max_text_tokens,
        max_image_pixels=spec.limits.max_image_pixels,
        max_conversation_items=spec.limits.max_conversation_items,
        uploaded_speaker=_uploaded_speaker(state.uploaded_speaker) if state.uploaded_speaker else None,
    )


def _uploaded_speaker(lookup: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """The speech package's lookup with realtime errors: a voice that cannot speak here is the
    client's error; a registry that cannot be read leaves the name unknown (the default speaker)."""

    def speaker(name: str) -> str | None:
        try:
            return lookup(name)
        except SpeechError as error:
            raise RealtimeError(error.code or "invalid_value", error.message) from None
        except Exception as exc:  # noqa: BLE001 - storage trouble must not end the session
            log.warning("cannot look voice %r up in the voice registry: %s", name, exc)
            return None

    return speaker
