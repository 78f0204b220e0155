"""The profile's `sip:` section: checked before anything loads, one line per problem."""

from __future__ import annotations

import pytest

from session_server.profile import profile_errors
from session_server.telephony.config import TelephonyConfig, parse_listen
from tests.realtime.fakes import realtime_profile


def test_no_sip_section_means_no_sip_endpoint():
    assert TelephonyConfig.from_profile(realtime_profile()).listen is None


def test_a_full_sip_section_is_read():
    profile = {**realtime_profile(), "sip": {"listen": "udp:127.0.0.1:5070", "webhook_url": "https://example.org/hook",
                                            "webhook_secret": "whsec_x", "accept": {"instructions": "Hi."},
                                            "answer_timeout_s": 5, "media_timeout_s": 12}}
    config = TelephonyConfig.from_profile(profile)
    assert (config.listen, config.accept, config.answer_timeout_s, config.media_timeout_s) == (("127.0.0.1", 5070), {"instructions": "Hi."}, 5, 12)
    assert profile_errors(profile) == []


@pytest.mark.parametrize("sip, line", [
    ({"listne": "udp:0.0.0.0:5060"}, "sip.listne: unknown key"),
    ({"listen": "tcp:0.0.0.0:5060"}, "sip.listen: 'tcp:0.0.0.0:5060' is not udp:HOST:PORT"),
    ({"media_timeout_s": 0}, "sip.media_timeout_s"),
    ({"webhook_url": "https://example.org/hook"}, "sip.webhook_secret: a webhook_url needs a secret"),
])
def test_a_bad_sip_section_is_one_line_naming_its_key(sip, line):
    errors = profile_errors({**realtime_profile(), "sip": sip})
    assert len(errors) == 1 and errors[0].startswith(line), errors


def test_listen_is_udp_host_port():
    assert parse_listen("udp:[::1]:5060") == ("::1", 5060)
    with pytest.raises(ValueError, match="--sip"):
        parse_listen("udp:host")


def test_serve_sip_sets_the_profiles_listen_over_its_own():
    from session_server.cli import _set_section_flags, build_parser

    profile = {"sip": {"listen": "udp:0.0.0.0:5060", "accept": {"instructions": "Hi."}}}
    _set_section_flags(profile, build_parser().parse_args(["serve", "--sip", "udp:127.0.0.1:5070"]))
    assert profile["sip"] == {"listen": "udp:127.0.0.1:5070", "accept": {"instructions": "Hi."}}


def test_serve_sip_on_an_address_in_use_is_one_line_before_anything_loads():
    import socket

    from session_server.cli import _sip_unavailable

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        why = _sip_unavailable({"sip": {"listen": f"udp:127.0.0.1:{port}"}}, enable_realtime=True)
    assert why is not None and why.startswith(f"--sip: cannot listen on udp:127.0.0.1:{port}")
    assert _sip_unavailable({"sip": {"listen": "udp:127.0.0.1:5070"}}, enable_realtime=False) == \
        "--sip: SIP calls are realtime sessions: add --enable-realtime"
