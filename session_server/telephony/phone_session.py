"""What every phone wire does to make a call a session: its protocol core, then its `PhoneCall`.

`phone_protocol` builds the realtime protocol of a call from session configs applied in order
(the wire's audio formats, the profile's `sip.accept` or an `accept` request's body, a carrier's
custom parameters...), each as a `session.update` patch; a config the core refuses raises its
`RealtimeError` (the wire turns it into its own refusal: an error message, a SIP status).
`start_call` opens the graph session (`SessionRejected` when there is no slot), registers the
call (phone calls, live sessions, tracing) and starts it.
"""

from __future__ import annotations

from typing import Any

from session_server.realtime.events import RealtimeError
from session_server.realtime.protocol import RealtimeProtocol, realtime_unavailable, reply_input_for
from session_server.realtime.served import served_model
from session_server.realtime.voice_lookups import look_up_voices
from session_server.state import ServerState
from session_server.telephony.phone_call import PhoneCall, PhoneWire
from session_server.telephony.registry import PhoneCalls


def phone_audio(kind: str) -> dict[str, Any]:
    """What the session is told its audio is: the wire's G.711 both ways (as OpenAI's SIP sessions say)."""
    return {"audio": {"input": {"format": {"type": kind}}, "output": {"format": {"type": kind}}}}


async def phone_protocol(state: ServerState, session_id: str, *sessions: dict[str, Any]) -> RealtimeProtocol:
    if (why := realtime_unavailable(state.runtime.spec.inputs)) is not None:
        raise RealtimeError("realtime_unavailable", why, type="server_error")
    protocol = RealtimeProtocol(session_id, state.settings.model_id, audio_deltas=False,
                                reply_input=reply_input_for(state.runtime.spec.inputs), served=served_model(state),
                                usage_totals=state.metrics.usage)
    try:
        for session in sessions:
            if session:
                await look_up_voices(protocol, {"type": "session.update", "session": session})
                protocol.configure_initial(session)
    except RecursionError:
        raise RealtimeError("invalid_json", "The session config is nested too deeply.") from None
    return protocol


async def start_call(state: ServerState, calls: PhoneCalls, call_id: str, protocol: RealtimeProtocol, wire: PhoneWire,
                     transport: str, media_timeout_s: float, on_closed=lambda call: None) -> PhoneCall:
    """Open the call's graph session and start the call; raises `SessionRejected` (nothing held then)."""
    graph = await state.runtime.open_session(protocol.session_id, "realtime", protocol.graph_config())

    def closed(call: PhoneCall) -> None:
        calls.forget(call)
        state.sessions.forget(call)
        if call.trace is not None:
            call.trace.close()
        on_closed(call)

    call = PhoneCall(call_id, protocol, wire, transport, media_timeout_s, on_closed=closed, metrics=state.metrics)
    calls.add(call)
    state.sessions.add(call, "realtime", transport, call_id=call_id)  # type: ignore[arg-type]  # a phone transport
    if state.tracing is not None:
        call.trace = state.tracing.session(protocol.session_id, transport, protocol.usage)
    call.start(graph)
    return call
