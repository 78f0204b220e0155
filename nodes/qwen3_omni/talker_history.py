"""A session's user turns in talker space (the talker's only state across turns).

`generate()` rebuilds the talker's prefill from one full prompt each time. A session cannot: the
thinker's KV cache keeps no hidden states, and the audio/image positions of a user turn need the
thinker's layer-`accept_hidden_layer` hidden states from that turn's prefill. So the talker keeps,
per user message, its token ids and their talker-space embeddings (text positions through
`text_projection`, multimodal positions through `hidden_projection`), built when the turn was
prefilled (or from the whole history again when the thinker rebuilt it: `restart`); every
reply's prefill starts with all of them. It also keeps the talker KV of those
user turns from the last reply (`keep_kv`), so a reply puts only the user turns that are new since
the last reply (and its 9-position assistant block) through the talker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from nodes.qwen3_omni.talker_model import TalkerModel

# The assistant header `<|im_start|>assistant\n`: its first three tokens open the talker's assistant block.
ASSISTANT_HEADER_TOKENS = 3


class _UserSegment:
    """One user message's token ids [n] and their talker-space embeddings [n, D]; given as the
    thinker's hidden states (`lazy`), the embeddings are projected at their first use, inside the
    reply's prefill (compute), not when the message arrives (the node's task)."""

    __slots__ = ("token_ids", "_embeds", "_lazy")

    def __init__(self, token_ids: torch.Tensor, embeds: torch.Tensor | None = None,
                 lazy: tuple[TalkerModel, torch.Tensor | None] | None = None):
        self.token_ids = token_ids
        self._embeds = embeds
        self._lazy = lazy

    @property
    def embeds(self) -> torch.Tensor:
        if self._embeds is None:
            assert self._lazy is not None
            talker, mm_hidden = self._lazy
            self._embeds = talker.prompt_embeds(self.token_ids, mm_hidden)
            self._lazy = None
        return self._embeds


@dataclass
class TalkerHistory:
    """A session's user turns in talker space, built as the thinker prefills each turn.

    Feed it every token the thinker consumes, in order (prompts with their hidden states,
    replies by id): it tracks the role of each position the way `generate()` does (the token
    after the last `<|im_start|>`) and keeps the user positions.
    """

    talker: TalkerModel
    segments: list[_UserSegment] = field(default_factory=list)
    # The talker KV of the user turns, kept from the last reply's prefill (its first `kv_length`
    # positions are the user turns; the rest, that reply's block and frames, is cropped off by the
    # next reply). So a reply prefills only the user turns that are new since the last one.
    # Costs the talker KV of the user turns per session between replies; `keep_kv=False` drops it.
    keep_kv: bool = True
    kv: Any = None
    kv_length: int = 0
    image_grids: list[torch.Tensor] = field(default_factory=list)
    video_grids: list[torch.Tensor] = field(default_factory=list)
    audio_feature_lengths: list[torch.Tensor] = field(default_factory=list)
    _role: int | None = None
    _awaiting_role: bool = False  # an <|im_start|> ended the last chunk
    _held: _UserSegment | None = None  # that <|im_start|>, kept until its role is known
    _since_im_start: list[int] = field(default_factory=list)  # ids from the last <|im_start|> on

    def add_prompt(
        self,
        token_ids: torch.Tensor,
        mm_hidden: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
        audio_feature_lengths: torch.Tensor | None = None,
    ) -> None:
        """A prefill: its ids [L] and the accept-layer hidden states of its multimodal positions."""
        token_ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).cpu()
        if token_ids.numel() == 0:
            return
        embeds = self.talker.prompt_embeds(token_ids, mm_hidden)
        self._keep_user_positions(token_ids, embeds)
        self.add_grids(image_grid_thw, video_grid_thw, audio_feature_lengths)

    def add_grids(self, image_grid_thw=None, video_grid_thw=None, audio_feature_lengths=None) -> None:
        """A prefill's image/video grids and audio feature lengths (for the talker's 3-D positions)."""
        for grids, new in (
            (self.image_grids, image_grid_thw),
            (self.video_grids, video_grid_thw),
            (self.audio_feature_lengths, audio_feature_lengths),
        ):
            if new is not None and torch.as_tensor(new).numel():
                grids.append(torch.as_tensor(new).cpu())

    def add_user_part(self, token_ids: torch.Tensor, mm_hidden: torch.Tensor | None = None) -> None:
        """One user message the thinker already picked out (`ThinkerSession`'s `TalkerUserPart`):
        all its ids and the accept-layer hidden states of its multimodal positions. No model
        compute here: their talker-space embeddings are made at the first prefill that needs them.

        With this path the caller also passes the prefill's grids (`add_grids`) and ids (`track`).
        """
        token_ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).cpu()
        if token_ids.numel():
            self.segments.append(_UserSegment(token_ids, lazy=(self.talker, mm_hidden)))

    def track(self, token_ids: torch.Tensor | list[int]) -> None:
        """Follow prefilled ids for the assistant header only (their user parts came separately)."""
        self._track_header(torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).tolist())

    def add_reply(self, token_ids: torch.Tensor | list[int]) -> None:
        """Reply tokens the thinker generated (assistant role: only the role tracking cares)."""
        token_ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).cpu()
        if token_ids.numel():
            self._keep_user_positions(token_ids, None)

    def assistant_header(self) -> list[int] | None:
        """The open assistant header (`<|im_start|>assistant\\n`...) the last prompt ended with, if any."""
        header = self._since_im_start
        if len(header) >= ASSISTANT_HEADER_TOKENS and header[1] == self.talker.assistant_id:
            return list(header)
        return None

    def _track_header(self, ids: list[int]) -> None:
        for token in ids:
            if token == self.talker.im_start_id:
                self._since_im_start = []
            if len(self._since_im_start) < 64:  # a header is a few tokens; never hold a whole turn
                self._since_im_start.append(token)

    def _keep_user_positions(self, token_ids: torch.Tensor, embeds: torch.Tensor | None) -> None:
        ids = token_ids.tolist()
        self._track_header(ids)
        keep: list[int] = []
        start = 0
        if self._awaiting_role:
            self._role = ids[0]
            self._awaiting_role = False
            if self._held is not None and self._role == self.talker.user_id:
                self.segments.append(self._held)
            self._held = None
        for position, token in enumerate(ids[start:], start):
            if token == self.talker.im_start_id:
                if position + 1 < len(ids):
                    self._role = ids[position + 1]
                else:
                    self._awaiting_role = True
                    if embeds is not None:
                        self._held = _UserSegment(token_ids[position : position + 1], embeds[position : position + 1])
                    continue
            if self._role == self.talker.user_id:
                keep.append(position)
        if keep and embeds is not None:
            index = torch.tensor(keep)
            self.segments.append(_UserSegment(token_ids[index], embeds[index.to(embeds.device)]))
        elif keep:
            raise ValueError("user-role tokens arrived without prompt embeddings (as reply tokens)")

    def restart(self, user_parts: list[tuple[torch.Tensor, torch.Tensor | None]], tail_ids: list[int],
                image_grid_thw=None, video_grid_thw=None, audio_feature_lengths=None) -> None:
        """Start over from the thinker's rebuilt history (a new system prompt, an item deleted or
        inserted: `ThinkerSession.talker_view()`): all its user messages (token ids, accept-layer
        hidden states of their multimodal positions), grids, and the context from its last
        `<|im_start|>` on. The kept KV no longer matches: dropped."""
        self.segments = []
        self.image_grids, self.video_grids, self.audio_feature_lengths = [], [], []
        self.kv, self.kv_length = None, 0
        self._role, self._awaiting_role, self._held, self._since_im_start = None, False, None, []
        for token_ids, mm_hidden in user_parts:
            self.add_user_part(token_ids, mm_hidden)
        self.add_grids(image_grid_thw, video_grid_thw, audio_feature_lengths)
        self.track(tail_ids)

    def snapshot(self) -> tuple[Any, ...]:
        """State to `restore` after an out-of-band reply, which must leave no trace."""
        return (
            len(self.segments),
            len(self.image_grids),
            len(self.video_grids),
            len(self.audio_feature_lengths),
            self._role,
            self._awaiting_role,
            self._held,
            list(self._since_im_start),
        )

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        segments, images, videos, audios, self._role, self._awaiting_role, self._held, since = snapshot
        del self.segments[segments:]
        del self.image_grids[images:]
        del self.video_grids[videos:]
        del self.audio_feature_lengths[audios:]
        self._since_im_start = list(since)
        self.kv_length = min(self.kv_length, self.user_length)  # the forgotten turns' KV is cropped later

    def take_kv(self) -> tuple[Any, int]:
        """The kept KV cropped to the user turns it holds, and their length (None, 0: none kept)."""
        kv, length = self.kv, self.kv_length
        self.kv, self.kv_length = None, 0
        if kv is None or length > self.user_length:
            return None, 0
        extra = kv.get_seq_length() - length
        if extra > 0:
            kv.crop(-extra)
        return kv, length

    def keep(self, kv: Any, length: int) -> None:
        """Keep a reply's KV, whose first `length` positions are the user turns, for the next reply."""
        if self.keep_kv:
            self.kv, self.kv_length = kv, length

    @property
    def user_length(self) -> int:
        return sum(int(segment.token_ids.shape[0]) for segment in self.segments)
