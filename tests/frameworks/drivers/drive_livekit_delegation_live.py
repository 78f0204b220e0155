"""drive_livekit_live.py's `delegation` step alone, against a server whose model delegates
(tests/live/test_live_frameworks.py): `python drive_livekit_delegation_live.py CONFIG.json`."""

from __future__ import annotations

import asyncio

from drive_livekit_live import main

if __name__ == "__main__":
    asyncio.run(main(delegating=True))
