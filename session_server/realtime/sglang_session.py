"""sglang-omni's native session protocol, as far as this server speaks it.

sglang-omni's own session clients (their duplex recording client, their browser page) speak the
GA event names plus a negotiation layer: `session.update` may carry a `sglang` block (interaction,
tail_policy, timebase, sampling, reference_audio, max_slice_nums), and the server answers in
`session.updated` with `session.sglang.granted`: what it grants (formats and rates, the native
unit, input modalities, image format) and `rejections` for what it does not. Their clients send
16 kHz PCM16 and number their appends (`sglang: {seq, t_start_ms}`).

The input rate. A client that names no rate gets:
- 24 kHz (the GA default) when it speaks OpenAI's protocol;
- 16 kHz when it speaks the sglang dialect: a negotiation block in `session.update`, or (for
  clients that send no block, like the recording client) `sglang` fields on its first append.
Until one of these decides, the grant states 16 kHz (what an sglang client will get) while the GA
`audio.input.format` states 24 kHz (what an OpenAI client will get); each kind of client reads
only its own. The first append fixes the rate; from then on both say the same. A client whose
appends carry `t_start_ms` is checked against the server's own timeline: a mismatch (its audio is
at another rate than the server reads) is refused with `audio_rate_mismatch`, never misread.

The grant is `turn_based`: replies follow server VAD turns or commits, not a native full-duplex
unit clock. `native_unit_ms` (1000) is the unit a camera frame is bound to (`unit_<n>` in
`sglang.input_image.accepted`), one frame per unit; the tail policy is `flush` (input ended
mid-utterance is committed and answered as it is, nothing padded).

`GET /v1/realtime/capabilities` (their clients read it before they connect: their browser page
shows a voice control only for `supports_reference_audio`, sampling fields for
`sampling_parameters`, a text-only choice for `"text"` in `output_modalities`, a slice choice from
`input_image_format`) is what a new session of their dialect is granted, server-wide: the grant's
fields without `rejections` (nothing was asked yet), every output modality the server can give,
plus `model` (the name the server echoes) and `limits` (this server's own bounds, see
`capabilities`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from session_server.realtime.audio_formats import PCM, AudioFormat
from session_server.realtime.events import (
    RealtimeError,
    SamplingParam,
    SessionExtensionParam,
    SessionParam,
)

SGLANG_INPUT_RATE = 16000
NATIVE_UNIT_MS = 1000
TAIL_POLICY = "flush"
INTERACTION = "turn_based"
IMAGE_TYPES = ["image/jpeg", "image/png"]
SAMPLING_FIELDS = tuple(SamplingParam.__struct_fields__)
# Keys of their negotiation block: any one of them marks a client of the sglang dialect.
NEGOTIATION_FIELDS = ("interaction", "tail_policy", "timebase", "sampling", "reference_audio", "tts_reference_audio", "max_slice_nums")
# `t_start_ms` may differ from the server's timeline by this much (client rounding) before it is a mismatch.
TIMELINE_TOLERANCE_MS = 2.0


def sampling_values(extension: SamplingParam) -> dict[str, Any]:
    """The sampling settings a `sglang` block sets: this server's flat fields, and those of their
    nested `sampling` object that this server serves (the rest become rejections in the grant)."""
    values = {name: getattr(extension, name) for name in SAMPLING_FIELDS}
    nested = getattr(extension, "sampling", None)
    if nested:
        served = {key: value for key, value in nested.items() if key in SAMPLING_FIELDS}
        try:
            converted = msgspec.convert(served, SamplingParam)
        except msgspec.ValidationError as exc:
            path = str(exc).rsplit("`$.", 1)[-1].rstrip("`") if "`$." in str(exc) else ""
            raise RealtimeError("invalid_value", f"session.sglang.sampling: {exc}", f"session.sglang.sampling.{path}".rstrip(".")) from None
        values.update({name: getattr(converted, name) for name in served})
    return {name: value for name, value in values.items() if value is not None}


@dataclass
class Negotiation:
    """What one session's client asked for in its `sglang` blocks, and what its input rate is."""

    requested: dict[str, Any] = field(default_factory=dict)  # negotiation fields, latest value each
    requested_modalities: list[str] | None = None
    rate_named: bool = False  # the client named its input format itself
    speaks_sglang: bool = False
    rate_fixed: bool = False  # audio has arrived: the rate is no longer a default to choose

    def observe_update(self, patch: SessionParam) -> None:
        audio_in = patch.audio.input if patch.audio is not msgspec.UNSET else msgspec.UNSET
        if patch.input_audio_format is not msgspec.UNSET or (audio_in is not msgspec.UNSET and audio_in.format is not msgspec.UNSET):
            self.rate_named = True
        modalities = patch.output_modalities if patch.output_modalities is not msgspec.UNSET else patch.modalities
        if modalities is not msgspec.UNSET:
            self.requested_modalities = list(modalities)
        if isinstance(patch.sglang, SessionExtensionParam):
            block = {name: getattr(patch.sglang, name) for name in NEGOTIATION_FIELDS if getattr(patch.sglang, name) is not None}
            if block:
                self.speaks_sglang = True
                self.requested.update(block)

    def default_input(self, current: AudioFormat) -> AudioFormat | None:
        """The input format a not-yet-fixed default becomes for a client of the sglang dialect."""
        if self.speaks_sglang and not self.rate_named and current == AudioFormat():
            return AudioFormat(PCM, SGLANG_INPUT_RATE)
        return None

    def granted_input(self, current: AudioFormat) -> AudioFormat:
        if self.rate_named or self.rate_fixed or self.speaks_sglang:
            return current
        return AudioFormat(PCM, SGLANG_INPUT_RATE)  # undecided: what an sglang client will get

    def grant(self, config: Any, max_image_bytes: int) -> dict[str, Any]:
        """`session.sglang.granted` for the session as it now is."""
        input_format = self.granted_input(config.input_format)
        output = config.output_format
        return {
            "interaction": INTERACTION,
            "native_full_duplex": False,
            "proactive_output": False,
            "client_commit": True,
            "input_modalities": ["audio", "image"],
            "output_modalities": list(config.output_modalities),
            "input_audio_format": {"type": input_format.type, "rate": input_format.rate},
            "output_audio_format": {"type": output.type, "rate": output.rate},
            "input_image_format": {"types": IMAGE_TYPES, "max_bytes": max_image_bytes, "max_frames_per_unit": 1, "max_slice_nums": 1},
            "native_unit_ms": NATIVE_UNIT_MS,
            "first_unit_ms": NATIVE_UNIT_MS,
            "microturn_ms": None,
            "tail_policy": TAIL_POLICY,
            "supports_server_interrupt": True,
            "supports_truncate": True,
            "supports_resume": False,
            "partial_style": "append_only",
            "strict_order": True,
            "sampling_parameters": list(SAMPLING_FIELDS),
            "supports_reference_audio": False,
            "rejections": self.rejections(config),
        }

    def rejections(self, config: Any) -> list[dict[str, Any]]:
        """One entry {field, requested, reason, granted} per requested capability not granted."""
        asked = self.requested
        out: list[dict[str, Any]] = []

        def reject(name: str, requested: Any, reason: str, granted: Any) -> None:
            out.append({"field": name, "requested": requested, "reason": reason, "granted": granted})

        if asked.get("interaction") not in (None, INTERACTION):
            reject("sglang.interaction", asked["interaction"], "replies follow turns (server VAD or commits); native full duplex is not served", INTERACTION)
        if asked.get("tail_policy") not in (None, TAIL_POLICY):
            reject("sglang.tail_policy", asked["tail_policy"], "input ended mid-utterance is committed as it is (flush)", TAIL_POLICY)
        timebase = asked.get("timebase")
        if timebase is not None and timebase.native_unit_ms not in (None, NATIVE_UNIT_MS):
            reject("sglang.timebase.native_unit_ms", timebase.native_unit_ms, "the unit is fixed by the server", NATIVE_UNIT_MS)
        if timebase is not None and timebase.microturn_ms is not None:
            reject("sglang.timebase.microturn_ms", timebase.microturn_ms, "replies follow turns; there is no microturn cadence", None)
        for name in ("reference_audio", "tts_reference_audio"):
            if name in asked:
                reject(f"sglang.{name}", "audio/wav", "voice cloning is not served; choose a voice with audio.output.voice", None)
        if asked.get("max_slice_nums") not in (None, 1):
            reject("sglang.max_slice_nums", asked["max_slice_nums"], "each frame goes to the model whole", 1)
        for key in sorted(set(asked.get("sampling") or {}) - set(SAMPLING_FIELDS)):
            reject(f"sglang.sampling.{key}", asked["sampling"][key], "not a sampling parameter of this server", None)
        granted = list(config.output_modalities)
        if self.requested_modalities is not None and sorted(set(self.requested_modalities)) != sorted(granted):
            reject("output_modalities", self.requested_modalities, "an audio reply carries its text as the transcript", granted)
        return out


def capabilities(model: str, config: Any, max_image_bytes: int, limits: dict[str, Any]) -> dict[str, Any]:
    """`GET /v1/realtime/capabilities` for a new session whose defaults are `config`."""
    granted = Negotiation().grant(config, max_image_bytes)
    del granted["rejections"]
    granted["output_modalities"] = ["audio", "text"]  # what a session may ask for, not one session's choice
    return {"model": model, **granted, "limits": limits}


def check_timeline(t_start_ms: float | None, input_ms: float, rate: int) -> None:
    """Refuse an append whose `t_start_ms` says its audio is at another rate than the server reads
    (`audio_rate_mismatch`): the server's timeline, built at `rate`, would disagree with the client's."""
    if t_start_ms is None or t_start_ms <= 0 or input_ms <= 0:
        return
    if abs(t_start_ms - input_ms) <= max(TIMELINE_TOLERANCE_MS, 0.005 * t_start_ms):
        return
    implied = round(rate * input_ms / t_start_ms)
    raise RealtimeError(
        "audio_rate_mismatch",
        f"sglang.t_start_ms {t_start_ms:g} says this append starts {t_start_ms:g} ms into your audio, but read at the "
        f"session's input rate of {rate} Hz the audio so far lasts {input_ms:.3f} ms: your audio looks like {implied} Hz. "
        "Name the rate in session.update (session.audio.input.format.rate); this append was not accepted.",
        "sglang.t_start_ms",
    )
