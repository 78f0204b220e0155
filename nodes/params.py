"""The typed `params` of every node and resource type, as a profile may write them.

Checked with the whole profile before anything loads (graph/spec.py `params_errors`), so a typo
or a wrong type is one line naming the key, never a traceback once the model is loading. Each
node reads its params with its own default: a field left `UNSET` here means "the node's
default", so the default lives in one place, the node.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

Positive = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[float, Meta(ge=0)]


class Params(msgspec.Struct, forbid_unknown_fields=True):
    pass


class SileroVadParams(Params):
    model_path: str | None | UnsetType = UNSET  # None: the ONNX file of the silero-vad wheel
    max_batch: Positive | UnsetType = UNSET
    # Load the Smart Turn end-of-turn model (nodes/smart_turn.py) where the `smart-turn` extra is installed.
    smart_turn: bool | UnsetType = UNSET
    # Server VAD: say `SpeechPaused` this long before the silence would end the turn, so the
    # dialog can prefill the utterance early (nodes/vad.py). None or 0: off.
    prefill_early_ms: NonNegative | None | UnsetType = UNSET


class DialogParams(Params):
    max_utterance_seconds: Annotated[float, Meta(gt=0)] | UnsetType = UNSET
    max_queued_turns: Positive | UnsetType = UNSET
    max_utterance_frames: Annotated[int, Meta(ge=0)] | UnsetType = UNSET


class PreprocessingParams(Params):
    resource: str | UnsetType = UNSET
    max_utterance_frames: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    max_image_pixels: Positive | None | UnsetType = UNSET


class EncodersParams(Params):
    resource: str | UnsetType = UNSET
    max_batch: Positive | UnsetType = UNSET
    warmup: bool | UnsetType = UNSET


class ThinkerSamplingParams(Params):
    temperature: NonNegative | None | UnsetType = UNSET
    top_p: Annotated[float, Meta(gt=0, le=1)] | None | UnsetType = UNSET
    top_k: Annotated[int, Meta(ge=0)] | None | UnsetType = UNSET
    seed: int | None | UnsetType = UNSET


class ThinkerParams(Params):
    resource: str | UnsetType = UNSET
    max_seq_len: Positive | None | UnsetType = UNSET
    max_reply_tokens: Positive | None | UnsetType = UNSET
    sampling: ThinkerSamplingParams | None | UnsetType = UNSET
    max_batch: Positive | UnsetType = UNSET
    kv_slots: Positive | UnsetType = UNSET
    kv_capacity: Positive | UnsetType = UNSET
    batch_linger_ms: NonNegative | UnsetType = UNSET
    warmup: bool | UnsetType = UNSET
    max_transcript_tokens: Positive | UnsetType = UNSET


class TalkerSamplingParams(Params):
    do_sample: bool | UnsetType = UNSET
    temperature: NonNegative | UnsetType = UNSET
    top_k: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    top_p: Annotated[float, Meta(gt=0, le=1)] | UnsetType = UNSET
    repetition_penalty: Annotated[float, Meta(gt=0)] | UnsetType = UNSET
    seed: int | None | UnsetType = UNSET


class TalkerParams(Params):
    resource: str | UnsetType = UNSET
    sampling: TalkerSamplingParams | None | UnsetType = UNSET
    voices: dict[str, str] | None | UnsetType = UNSET  # alias -> the checkpoint's speaker name
    keep_user_kv: bool | UnsetType = UNSET
    max_batch: Positive | UnsetType = UNSET
    batch_linger_ms: NonNegative | UnsetType = UNSET
    max_reply_frames: Positive | None | UnsetType = UNSET
    max_frames_per_token: Annotated[float, Meta(gt=0)] | None | UnsetType = UNSET


class Code2WavParams(Params):
    resource: str | UnsetType = UNSET
    first_chunk_frames: Positive | UnsetType = UNSET
    chunk_frames: Positive | UnsetType = UNSET
    max_batch: Positive | UnsetType = UNSET


class OmniModelParams(Params):
    path: str | None | UnsetType = UNSET  # None: the tiny checkpoint, built locally
    device: str | None | UnsetType = UNSET  # cpu, cuda, cuda:N
    dtype: Literal["float32", "bfloat16", "float16"] | None | UnsetType = UNSET
    system_prompt: str | None | UnsetType = UNSET
    random_weights: Literal["qwen3-omni-30b-a3b"] | None | UnsetType = UNSET  # nodes/qwen3_omni/random_presets.py
    random_shrink: Positive | None | UnsetType = UNSET
    max_seq_len: Positive | None | UnsetType = UNSET
    max_reply_tokens: Positive | None | UnsetType = UNSET
    max_frames_per_token: Annotated[float, Meta(gt=0)] | None | UnsetType = UNSET
    max_reply_frames: Positive | None | UnsetType = UNSET
    # The thinker's and talker's KV slot caches: allocated at start from `limits` (one row per
    # session the KV budget admits) or growing on demand (nodes/qwen3_omni/slot_cache.py);
    # auto: at start on CUDA, growing on CPU.
    kv_cache: Literal["auto", "preallocate", "grow"] | None | UnsetType = UNSET
