"""The typed `params` of every node and resource type, as a profile may write them.

Checked with the whole profile before anything loads (graph/spec.py `params_errors`), so a typo
or a wrong type is one line naming the key, never a traceback once the model is loading. A node
decodes its params into its struct (`decode`) and reads attributes: the default lives here, in
the field. A field left `UNSET` is one whose default is not a constant but the model's (the
checkpoint's bounds, read once the resource is loaded), or whose absence differs from None.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

from graph.schema import convert_section

Positive = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[float, Meta(ge=0)]


class Params(msgspec.Struct, forbid_unknown_fields=True):
    pass


P = TypeVar("P", bound=Params)


def given(value, default):
    """`value`, or `default` where the profile left an `UNSET` field out."""
    return default if value is UNSET else value


def as_dict(section) -> dict | None:
    """A nested params section (sampling) as the plain mapping its own loader reads; None if left out."""
    return None if section is UNSET or section is None else msgspec.to_builtins(section)


def decode(params: dict | None, schema: type[P], key: str) -> P:
    """`params` as `schema`, defaults filled; ValueError naming `key`'s field when they do not fit
    (the profile was checked already: this is for nodes built outside a profile, as tests do)."""
    return convert_section(params, schema, key)


class SileroVadParams(Params):
    model_path: str | None = None  # None: the ONNX file of the silero-vad wheel
    max_batch: Positive = 64
    # Load the Smart Turn end-of-turn model (nodes/smart_turn.py) where the `smart-turn` extra is installed.
    smart_turn: bool = True
    # Server VAD: say `SpeechPaused` this long before the silence would end the turn, so the
    # dialog can prefill the utterance early (nodes/vad.py). None or 0: off.
    prefill_early_ms: NonNegative | None = 300


class DialogParams(Params):
    max_utterance_seconds: Annotated[float, Meta(gt=0)] = 60.0
    max_queued_turns: Positive = 8
    max_utterance_frames: Annotated[int, Meta(ge=0)] = 4  # images per turn: the newest win


class PreprocessingParams(Params):
    resource: str = "omni"
    max_utterance_frames: Annotated[int, Meta(ge=0)] = 4
    max_image_pixels: Positive | None = None  # None: the checkpoint's resize bound


class EncodersParams(Params):
    resource: str = "omni"
    max_batch: Positive = 16
    warmup: bool = True


class ThinkerSamplingParams(Params):
    temperature: NonNegative | None | UnsetType = UNSET
    top_p: Annotated[float, Meta(gt=0, le=1)] | None | UnsetType = UNSET
    top_k: Annotated[int, Meta(ge=0)] | None | UnsetType = UNSET
    seed: int | None | UnsetType = UNSET


class ThinkerParams(Params):
    resource: str = "omni"
    max_seq_len: Positive | None = None  # None: the model's bound
    max_reply_tokens: Positive | None = None  # None: the model's bound
    sampling: ThinkerSamplingParams | None | UnsetType = UNSET
    max_batch: Positive = 64
    kv_slots: Positive | UnsetType = UNSET  # UNSET: sized from the limits (nodes/thinker.py)
    kv_capacity: Positive | UnsetType = UNSET
    batch_linger_ms: NonNegative = 2.0
    warmup: bool = True
    max_transcript_tokens: Positive | UnsetType = UNSET  # UNSET: transcription.py's bound


class TalkerSamplingParams(Params):
    do_sample: bool | UnsetType = UNSET
    temperature: NonNegative | UnsetType = UNSET
    top_k: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    top_p: Annotated[float, Meta(gt=0, le=1)] | UnsetType = UNSET
    repetition_penalty: Annotated[float, Meta(gt=0)] | UnsetType = UNSET
    seed: int | None | UnsetType = UNSET


class TalkerParams(Params):
    resource: str = "omni"
    sampling: TalkerSamplingParams | None | UnsetType = UNSET
    voices: dict[str, str] | None = None  # alias -> the checkpoint's speaker name
    # Keep each session's talker KV of its user turns between replies (a reply then prefills only
    # the user turns new since the last one); costs that KV per session while it is idle.
    keep_user_kv: bool = True
    max_batch: Positive = 16
    # With fewer replies queued than its last batch, the batch waits this long for the rest.
    batch_linger_ms: NonNegative = 2.0
    # UNSET: the model's bounds; None: unbounded.
    max_reply_frames: Positive | None | UnsetType = UNSET
    max_frames_per_token: Annotated[float, Meta(gt=0)] | None | UnsetType = UNSET


class Code2WavParams(Params):
    resource: str = "omni"
    first_chunk_frames: Positive = 1
    chunk_frames: Positive = 6
    max_batch: Positive = 16


class OmniModelParams(Params):
    path: str | None = None  # None: the tiny checkpoint, built locally
    device: str | None = "cpu"  # cpu, cuda, cuda:N (None: cpu)
    dtype: Literal["float32", "bfloat16", "float16"] | None = "float32"
    system_prompt: str | None = None
    random_weights: Literal["qwen3-omni-30b-a3b"] | None = None  # nodes/qwen3_omni/random_presets.py
    random_shrink: Positive | None = 1
    # The reply bounds (nodes/qwen3_omni/bounds.py `ReplyBounds`); None: its default.
    max_seq_len: Positive | None = None
    max_reply_tokens: Positive | None = None
    max_frames_per_token: Annotated[float, Meta(gt=0)] | None = None
    max_reply_frames: Positive | None = None
    # The thinker's and talker's KV slot caches: allocated at start from `limits` (one row per
    # session the KV budget admits) or growing on demand (nodes/qwen3_omni/slot_cache.py);
    # auto: at start on CUDA, growing on CPU.
    kv_cache: Literal["auto", "preallocate", "grow"] | None = "auto"
