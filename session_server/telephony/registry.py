"""The live phone calls by call id: for sidebands, the admin API's hangup, and shutdown."""

from __future__ import annotations

from session_server.live_calls import LiveCalls
from session_server.telephony.phone_call import PhoneCall

PhoneCalls = LiveCalls[PhoneCall]
