"""The live WebRTC calls, so hangup can find one and shutdown can end them all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from session_server.live_calls import LiveCalls

if TYPE_CHECKING:  # call.py needs aiortc, which is optional (availability.py)
    from session_server.webrtc.call import Call

CallRegistry = LiveCalls["Call"]
