"""What a thinker session and the runner that serves it exchange: forward requests and errors.

`ThinkerSession` (thinker_engine.py) writes its model calls as generators of these requests;
`ThinkerRunner` and the executor's batch function (batched_thinker.py) answer them. Both import
this module and neither imports the other's internals, so the two stay free of an import circle.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import torch


class ThinkerError(RuntimeError):
    """An error a client can act on, with its `code` (`context_exhausted`, `no_reply`, `session_closed`)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Feed:
    """One token into one session's row; answered with its logits `[vocab]`."""

    slot: int
    token: int
    position: int  # rotary position (all three mrope rows: text tokens)
    owner: Any = None  # the ThinkerSession; the forward checks it still holds `slot`


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


Work = Generator["Feed | Chunk", Any, Any]
