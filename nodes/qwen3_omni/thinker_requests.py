"""What a thinker session and the runner that serves it exchange: forward requests and errors.

`ThinkerSession` (thinker_engine.py) writes its model calls as generators of these requests;
`ThinkerRunner` and the executor's batch function (batched_thinker.py) answer them. Both import
this module and neither imports the other's internals, so the two stay free of an import circle.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


class ThinkerError(RuntimeError):
    """An error a client can act on, with its `code` (`context_exhausted`, `no_reply`, `session_closed`)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Choice:
    """How the next token of one reply is chosen (thinker_sampling.py does it on the device)."""

    sampling: Any  # the reply's `Sampling` (thinker_sampling.py)
    generator: torch.Generator | None = None  # on the model's device; None: the device's default
    seen: torch.Tensor | None = None  # [vocab] bool on the device: the context's ids (repetition penalty)
    allowed: torch.Tensor | None = None  # [vocab] bool on the host: the ids the tool-call grammar allows; None: any


class Fed(NamedTuple):
    """The answer to a `Feed` or a `Choose`: the row's logits `[vocab]` (a view of the step's
    batch, on the device) and the token its `choice` chose (None without a choice)."""

    logits: torch.Tensor
    token: int | None


@dataclass
class Feed:
    """One token into one session's row; answered with a `Fed`. With a `choice`, the next token
    is chosen from the new logits in the same step, together with every other row's (one read
    of the chosen ids for the whole batch)."""

    slot: int
    token: int
    position: int  # rotary position (all three mrope rows: text tokens)
    owner: Any = None  # the ThinkerSession; the forward checks it still holds `slot`
    choice: Choice | None = None


@dataclass
class Choose:
    """The next token of one row from logits it holds already (a prefill's last position); no
    forward. Answered with a `Fed` (these logits, the chosen token), in the same pass as the
    step's feeds."""

    slot: int
    logits: torch.Tensor  # [vocab]
    choice: Choice
    owner: Any = None


@dataclass
class Chunk:
    """Part of a prefill into one row; answered with (logits of its last position, accept-layer hidden or None)."""

    slot: int
    embeds: torch.Tensor  # [1, q, D]
    positions: torch.Tensor  # [3, 1, q]
    deepstack: list[torch.Tensor] | None = None
    visual_mask: torch.Tensor | None = None  # [1, q]
    hidden_layer: int | None = None
    owner: Any = None  # the ThinkerSession; the forward checks it still holds `slot`


Work = Generator["Feed | Choose | Chunk", Any, Any]
