"""The live phone calls by call id: for sidebands, the admin API's hangup, and shutdown."""

from __future__ import annotations

import asyncio

from session_server.telephony.phone_call import PhoneCall


class PhoneCalls:
    def __init__(self) -> None:
        self._calls: dict[str, PhoneCall] = {}

    def add(self, call: PhoneCall) -> None:
        self._calls[call.id] = call

    def get(self, call_id: str) -> PhoneCall | None:
        return self._calls.get(call_id)

    def forget(self, call: PhoneCall) -> None:
        if self._calls.get(call.id) is call:
            del self._calls[call.id]

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self):
        return iter(list(self._calls.values()))

    async def close_all(self, reason: str) -> None:
        await asyncio.gather(*(call.close(reason) for call in list(self._calls.values())), return_exceptions=True)
