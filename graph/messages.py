"""Every message that flows through a session graph, in one module.

Data messages travel on bounded edges in order. Controls (`Interrupt`, `Truncate`, `Close`)
travel beside them and overtake queued data: the runtime hands a control to every node of the
session at once and drops queued data of the turn it cancels. A transport's instructions to a
node are typed data messages too, one class per instruction under the `Command` base
(`Configure`, `Commit`, `Clear`, `AddItem`, `DeleteItem`, `CreateResponse`,
`InputEnd`): they ride the input path in order with the audio, and nodes forward those they do
not act on.

Audio is carried as numpy arrays (never base64 or bytes inside the graph): input audio is
float32 mono at the rate named in the message, output audio is float32 mono at 24 kHz.

Each message carries the session id, the turn it belongs to (`turn_id`, -1 for input that is
not yet part of a turn) and its media time in milliseconds on the session's input timeline.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Literal

import msgspec
import numpy as np


class Message(msgspec.Struct, kw_only=True):
    session_id: str = ""
    turn_id: int = -1
    media_ms: float = 0.0


# --------------------------------------------------------------------------- input side


class AudioChunk(Message, kw_only=True):
    """Input audio as it arrives from the client (float32 mono in [-1, 1]).

    `received_at`: when it reached the server (`time.monotonic()`; `GraphSession.send` sets it
    when absent). Compute on this audio is due then, however long it queued since.
    """

    samples: np.ndarray
    sample_rate: int
    received_at: float | None = None


class ImageFrame(Message, kw_only=True):
    """A camera frame (encoded JPEG/PNG bytes) at `media_ms` on the input audio timeline."""

    image: bytes


class SpeechStarted(Message, kw_only=True):
    """`confirmed` False: a sound's first window, not yet `interrupt_min_speech_ms` long. The VAD
    sends a second, confirmed `SpeechStarted` (same `audio_start_ms`) once it has lasted that long,
    or a `SpeechDismissed` when it goes quiet first (a cough, a click)."""

    audio_start_ms: float
    confirmed: bool = True


class SpeechDismissed(Message, kw_only=True):
    """An unconfirmed sound went quiet before it lasted `interrupt_min_speech_ms`: barge-in
    ignores it. The VAD's segment goes on (a `SpeechStopped` still ends it)."""

    audio_end_ms: float


class SpeechStopped(Message, kw_only=True):
    audio_end_ms: float


class SpeechPaused(Message, kw_only=True):
    """Server VAD: the speaker has been quiet long enough that the turn will probably end
    (`prefill_early_ms` before the silence would end it); `audio_end_ms` is where the audio heard
    so far ends. `resumed=True`: speech came back before the turn ended (the pause is over). The
    dialog may prefill the utterance early on a pause (`Turn.speculative`)."""

    audio_end_ms: float
    resumed: bool = False


class Truncation(msgspec.Struct, kw_only=True, frozen=True):
    """How the model's context makes room when the conversation would not fit it (GA
    `session.truncation`): `auto` drops the oldest items until the next turn and its reply fit;
    `disabled` fails the turn with `context_exhausted`; `retention_ratio` drops the oldest items,
    once the conversation after the instructions would pass `post_instructions` tokens (None: the
    context less the reply's reserve), down to `retention_ratio` of that limit, so that
    truncations are rare and the cached prefix survives most turns. The instructions and tools are
    never dropped; dropped items stay in the client's conversation (nodes/qwen3_omni/truncation.py)."""

    type: str = "auto"  # auto | disabled | retention_ratio
    retention_ratio: float = 1.0
    post_instructions: int | None = None


class ReplyParams(msgspec.Struct, kw_only=True):
    """What a reply should look like (from session config and `response.create`)."""

    response_id: str = ""
    output_modalities: tuple[str, ...] = ("audio",)
    instructions: str | None = None
    max_output_tokens: int | None = None
    voice: str | None = None
    # `conversation: "none"`: answer out of band, leave no trace in the session's history.
    out_of_band: bool = False
    sampling: dict[str, Any] = {}
    # Function tools ({type, name, description, parameters}) the reply may call, and how:
    # "auto" | "none" | "required" | {"type": "function", "name": ...}.
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, str] = "auto"
    parallel_tool_calls: bool = True
    # The session's truncation mode in force for this reply (and, until the next reply says
    # otherwise, for the turns without a reply that follow it).
    truncation: Truncation = msgspec.field(default_factory=Truncation)


class Turn(Message, kw_only=True):
    """One unit of conversation for the model: a user utterance, a text item, or a reply request.

    `audio` is 16 kHz float32 mono. `reply` set means: answer now, over everything the
    conversation holds so far (including this turn). A turn with no content and a reply is a
    plain `response.create`. `role="assistant"` with `text` and `speak=True` is a stateless
    speech request: the reply is exactly `text`, spoken (teacher-forced, no sampling).
    `instructions` (and `tools`) make the system prompt the history starts with from this turn on.
    """

    item_id: str = ""
    role: str = "user"
    text: str | None = None
    audio: np.ndarray | None = None
    images: list[bytes] = []
    reply: ReplyParams | None = None
    speak: bool = False
    instructions: str | None = None
    # The session's function tools: with `instructions`, they make the system prompt.
    tools: tuple[dict[str, Any], ...] = ()
    # Role "tool": a function's output for `call_id` (text); role "assistant" with `call` set: a
    # function call ({name, arguments, call_id}) the client added to the conversation.
    call: dict[str, Any] | None = None
    # Edits of the model's history; the thinker rebuilds its KV from the first changed position
    # (nodes/qwen3_omni/thinker_history.py). A history key is an item id; a reply's is its response id.
    # insert_after: None = at the end; else the keys of the items before this one, nearest first:
    # it goes after the first of them the model holds (first, after the system prompt, if none).
    insert_after: list[str] | None = None
    # A turn without content that removes the item with this history key from the model's history.
    delete_key: str | None = None
    # A reply to this turn follows at once (server VAD that creates responses): its listener is
    # waiting from now, so the turn's compute is as urgent as the reply's (graph/session.py).
    awaited: bool = False
    # Transcribe this turn's audio once it is in the model's history ({language, prompt,
    # keep_in_history}; None: no transcript): an out-of-band pass of the thinker
    # (nodes/qwen3_omni/transcription.py) that reports `transcription_*` NodeEvents.
    transcribe: dict[str, Any] | None = None
    # Early prefill (server VAD, during the pause before a turn ends): `speculative` marks a user
    # utterance sent ahead of its commit under a private `item_id`, with the automatic reply it
    # will have under a provisional response id (not asked for yet: graph/session.py counts no
    # reply); the model prefills both and tells no one. A later turn with `confirms` = that key
    # makes it the committed item (this turn's own `item_id`, its reply — the same params, the
    # real response id — and transcript; the turn carries no content of its own), or a turn with
    # `retracts` = that key removes it as if it had never come (speech resumed).
    speculative: bool = False
    confirms: str | None = None
    retracts: str | None = None


# --------------------------------------------------------------------------- model side


class TurnMeta(msgspec.Struct, kw_only=True, frozen=True):
    """What the thinker (and its transcriber) must know of a turn besides its tensors: made by
    preprocessing from the `Turn`, passed on unchanged by the encoders. Copy with changes via
    `msgspec.structs.replace`."""

    role: str = "user"
    insert_after: list[str] | None = None  # as `Turn.insert_after`
    delete_key: str | None = None  # as `Turn.delete_key`
    # The turn's input tokens by kind (usage, and which items the transcriber counts as spoken).
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0
    awaited: bool = False  # as `Turn.awaited`
    transcribe: dict[str, Any] | None = None  # as `Turn.transcribe`
    speculative: bool = False  # as `Turn.speculative`
    confirms: str | None = None  # as `Turn.confirms`
    retracts: str | None = None  # as `Turn.retracts`
    # A stateless speech request (`Turn.speak`): the reply is exactly `text`, spoken.
    speak: bool = False
    text: str = ""


class Features(Message, kw_only=True):
    """Model inputs for one turn (token ids, audio features, image pixels) and its `TurnMeta`."""

    item_id: str = ""
    tensors: dict[str, Any] = {}
    reply: ReplyParams | None = None
    meta: TurnMeta = msgspec.field(default_factory=TurnMeta)


class Embeddings(Message, kw_only=True):
    """A turn's `Features` with its audio and images encoded (the thinker's input)."""

    item_id: str = ""
    tensors: dict[str, Any] = {}
    reply: ReplyParams | None = None
    meta: TurnMeta = msgspec.field(default_factory=TurnMeta)


class TextDelta(Message, kw_only=True):
    """Reply text as it is generated. `token_ids` are the thinker tokens behind `text`."""

    response_id: str = ""
    text: str
    token_ids: tuple[int, ...] = ()


class FunctionCall(Message, kw_only=True):
    """A function call the reply made, whole: `arguments` is JSON text valid under the tool's schema
    (decoding was constrained to it). `index` counts the reply's calls from 0."""

    response_id: str = ""
    index: int = 0
    name: str
    arguments: str


class TalkerPrompt(Message, kw_only=True):
    """What went through the thinker, for the talker's own history (after every thinker prefill,
    or the thinker's whole rebuilt history). Model-side values (hidden states, grids) are the
    model's tensors, opaque to the graph."""

    token_ids: tuple[int, ...] = ()  # every token that went through the thinker (history: the context from its last `<|im_start|>`)
    # The user messages among them, cut per message (`TalkerUserPart`: token_ids, multimodal_hidden);
    # None: the talker finds them itself from `mm_hidden`.
    user_parts: list[Any] | None = None
    mm_hidden: Any = None  # [n_mm, H] hidden states at the audio/image positions
    image_grid_thw: Any = None
    video_grid_thw: Any = None
    audio_feature_lengths: Any = None
    history: bool = False  # the thinker rebuilt its history: start over from all of it
    out_of_band: bool = False  # a reply that leaves no trace follows (undone at its TurnDone)
    reply_follows: bool = False  # a reply to this very prefill follows at once


# Why the thinker's reply ended: EOS or a finished tool call (`stop`), the session's bound
# (`length`), the reply's `max_output_tokens`, the context (`context_exhausted`), or an interrupt.
FinishReason = Literal["stop", "length", "max_output_tokens", "context_exhausted", "interrupted"]


class HiddenChunk(Message, kw_only=True):
    """One or more reply tokens of the thinker, for the talker."""

    response_id: str = ""
    token_ids: tuple[int, ...] = ()
    reply: ReplyParams | None = None  # on a reply's first chunk
    voice: str | None = None  # on a reply's first chunk: the voice asked for (else the session's)
    finish_reason: FinishReason | None = None  # on the last chunk (`stop` = EOS, spoken whole)
    final: bool = False


class CodecFrames(Message, kw_only=True):
    """Codec frames (shape [frames, code_groups], int) from the talker."""

    response_id: str = ""
    codes: np.ndarray
    final: bool = False


class AudioOut(Message, kw_only=True):
    """Reply audio, float32 mono."""

    response_id: str = ""
    samples: np.ndarray
    sample_rate: int = 24000


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    input_image_tokens: int = 0
    cached_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


# How a reply ended, as `response.done` reports it: whole, cut by an interrupt or cancel, failed
# (`reason` says why), or stopped by a bound (`reason`: `max_output_tokens`, `context_exhausted`).
ReplyStatus = Literal["completed", "cancelled", "failed", "incomplete"]


class TurnDone(Message, kw_only=True):
    """End of a reply (`status`: `ReplyStatus`)."""

    response_id: str = ""
    status: ReplyStatus = "completed"
    reason: str | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    transcript: str = ""


class NodeEvent(Message, kw_only=True):
    """Base of a node's notices for the transport: one class per notice, with typed fields. The
    protocol layer maps each onto its own wire events; the graph does not know any wire format.
    `kind` names the notice (logs, metrics, tests)."""

    kind: ClassVar[str] = ""

    def payload(self) -> dict[str, Any]:
        """The notice's own fields (without the session, turn and media time every message has)."""
        return {name: getattr(self, name) for name in self.__struct_fields__ if name not in Message.__struct_fields__}


class InputSpeechStarted(NodeEvent, kw_only=True):
    """dialog: a confirmed utterance began (server VAD); the item it will become."""

    kind: ClassVar[str] = "speech_started"
    audio_start_ms: float
    item_id: str


class InputSpeechStopped(NodeEvent, kw_only=True):
    """dialog: the utterance ended (server VAD, or the input ended mid-utterance)."""

    kind: ClassVar[str] = "speech_stopped"
    audio_end_ms: float
    item_id: str


class InputSoundStarted(NodeEvent, kw_only=True):
    """dialog: a sound began that may become speech (playback may hold meanwhile)."""

    kind: ClassVar[str] = "sound_started"
    audio_start_ms: float


class InputSoundDismissed(NodeEvent, kw_only=True):
    """dialog: that sound ended without becoming speech."""

    kind: ClassVar[str] = "sound_dismissed"


class InputTimeout(NodeEvent, kw_only=True):
    """dialog: the idle timeout committed the (silent) audio since `audio_start_ms`."""

    kind: ClassVar[str] = "timeout_triggered"
    audio_start_ms: float
    audio_end_ms: float
    item_id: str


class InputCleared(NodeEvent, kw_only=True):
    """dialog: the uncommitted input was dropped (`Clear`)."""

    kind: ClassVar[str] = "cleared"


class InputEnded(NodeEvent, kw_only=True):
    """dialog: all input up to `audio_end_ms` was taken in after `InputEnd`."""

    kind: ClassVar[str] = "input_ended"
    audio_end_ms: float


class InputCommitted(NodeEvent, kw_only=True):
    """dialog: an utterance became user item `item_id` (its turn is this message's `turn_id`);
    `response_id`: the reply the dialog requested with it (`auto_reply` under server VAD), if any."""

    kind: ClassVar[str] = "committed"
    item_id: str
    audio_ms: float = 0.0
    image_count: int = 0
    auto_reply: bool = False
    response_id: str = ""


class TurnQueued(NodeEvent, kw_only=True):
    """dialog: the reply `response_id` is turn `turn_id`."""

    kind: ClassVar[str] = "turn_queued"
    response_id: str


class NodeError(NodeEvent, kw_only=True):
    """A request a node refused or could not serve, in the protocol's error terms; `response_id`:
    the reply that will not come, if one was asked for."""

    kind: ClassVar[str] = "error"
    code: str
    message: str
    param: str | None = None
    response_id: str = ""


class TranscriptDelta(NodeEvent, kw_only=True):
    """thinker: a piece of user item `item_id`'s transcript."""

    kind: ClassVar[str] = "transcription_delta"
    item_id: str
    delta: str


class TranscriptCompleted(NodeEvent, kw_only=True):
    """thinker: user item `item_id`'s whole transcript; `usage`: the pass's token counts."""

    kind: ClassVar[str] = "transcription_completed"
    item_id: str
    transcript: str
    usage: dict[str, int] = {}


class TranscriptFailed(NodeEvent, kw_only=True):
    """thinker: no transcript of user item `item_id`."""

    kind: ClassVar[str] = "transcription_failed"
    item_id: str
    code: str
    message: str


# --------------------------------------------------------------------------- controls


class Control(Message, kw_only=True):
    """Base of the messages that overtake data."""


class ReplyControl(Control, kw_only=True):
    """A control about one reply: the response `response_id` names, else every reply of `turn_id`
    (every reply at all when `turn_id < 0`). The one rule every node matches replies by."""

    response_id: str = ""

    def names(self, turn_id: int, response_id: str | None) -> bool:
        if self.response_id:
            return self.response_id == response_id
        return self.turn_id < 0 or self.turn_id == turn_id


class Interrupt(ReplyControl, kw_only=True):
    """Stop the reply named (barge-in, response.cancel)."""

    reason: str = "interrupted"


class Truncate(ReplyControl, kw_only=True):
    """The listener heard only `audio_end_ms` of the reply named; forget the rest."""

    item_id: str = ""
    audio_end_ms: float = 0.0


class Close(Control, kw_only=True):
    reason: str = "closed"


class Stage(StrEnum):
    """The part of a graph that a `Command` is for. Its node acts on it, whatever node type fills
    that part in a profile; every other node forwards it."""

    VAD = "vad"  # nodes/vad.py: turn detection settings
    DIALOG = "dialog"  # nodes/dialog.py: the conversation's items, commits, replies


class Command(Message, kw_only=True):
    """Base of a transport's instructions to a node: one subclass per instruction, below.

    Commands are data, not controls: they travel the input path in order with the audio, so a
    `Commit` sent after some appends always sees those appends. Nodes forward the commands they
    do not act on. `target` is the `Stage` that acts on it (the dialog by default, except for
    `Configure`, which names its stage). An interrupt never drops a queued command (graph/session.py).
    """

    target: Stage


class Configure(Command, kw_only=True):
    """The session's graph config (the protocol's `graph_config()`: `turn_detection`,
    `instructions`, `tools`, `auto_reply`, `transcription`...), for the stage `target` names."""

    config: dict[str, Any]


class Commit(Command, kw_only=True):
    """End the utterance buffered so far and make it a turn (`input_audio_buffer.commit`)."""

    target: Stage = Stage.DIALOG


class Clear(Command, kw_only=True):
    """Drop the utterance buffered so far (`input_audio_buffer.clear`)."""

    target: Stage = Stage.DIALOG


class AddItem(Command, kw_only=True):
    """A client-created conversation item (or one replayed on resume), for the model's history.

    `audio` is float32 mono at `sample_rate` (the dialog resamples it to 16 kHz); `call` is a
    function call ({name, arguments}) with role "assistant"; role "tool" carries a function's
    output in `text`. `insert_after` as `Turn.insert_after` (None: at the end).
    """

    target: Stage = Stage.DIALOG
    item_id: str
    role: str
    text: str | None = None
    call: dict[str, Any] | None = None
    audio: np.ndarray | None = None
    sample_rate: int = 16000
    images: tuple[bytes, ...] = ()
    insert_after: list[str] | None = None


class DeleteItem(Command, kw_only=True):
    """Remove an item from the model's history: a reply's item by its `response_id`, else by `item_id`."""

    target: Stage = Stage.DIALOG
    item_id: str
    response_id: str | None = None


class CreateResponse(Command, kw_only=True):
    """Answer now, over everything the conversation holds (`response.create`)."""

    target: Stage = Stage.DIALOG
    reply: ReplyParams


class InputEnd(Command, kw_only=True):
    """The client's input audio ended: what is left of the utterance becomes a last turn."""

    target: Stage = Stage.DIALOG


DATA_TYPES: dict[str, type[Message]] = {
    cls.__name__: cls
    for cls in (
        AudioChunk,
        ImageFrame,
        SpeechStarted,
        SpeechDismissed,
        SpeechStopped,
        SpeechPaused,
        Turn,
        Features,
        Embeddings,
        TextDelta,
        FunctionCall,
        HiddenChunk,
        TalkerPrompt,
        CodecFrames,
        AudioOut,
        TurnDone,
        NodeEvent,
        Configure,
        Commit,
        Clear,
        AddItem,
        DeleteItem,
        CreateResponse,
        InputEnd,
    )
}
