"""deploy/haproxy.cfg's routing on its own, in front of two stand-in replicas (tiny HTTP servers
that say who they are): new sessions by least connections, a session's later requests to the
replica its table learned from the replica's answer, else to the one a consistent hash of the
session's key picks."""

from __future__ import annotations

import contextlib
import os
import http.server
import subprocess
import threading
import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import httpx

from tests.conftest import REPO, free_port


class _Replica(http.server.ThreadingHTTPServer):
    def __init__(self, name: str):
        super().__init__(("127.0.0.1", free_port()), _Handler)
        self.name = name
        self.next_session_id = ""  # what a new session's handshake answer names


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Replica

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        query = parse_qs(urlparse(self.path).query)
        self.send_response(200)
        if self.path.startswith("/v1/realtime") and "session_id" not in query:
            self.send_header("x-sglang-session-id", self.server.next_session_id)
        self.send_header("content-type", "text/plain")
        self.end_headers()
        self.wfile.write(self.server.name.encode())

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def proxy_and_replicas() -> Iterator[tuple[str, list[_Replica]]]:
    replicas = [_Replica("replica1"), _Replica("replica2")]
    threads = [threading.Thread(target=r.serve_forever, daemon=True) for r in replicas]
    for thread in threads:
        thread.start()
    port = free_port()
    env = {**os.environ, "SGL_PROXY_BIND": f"127.0.0.1:{port}",
           "SGL_REPLICA_1": f"127.0.0.1:{replicas[0].server_port}", "SGL_REPLICA_2": f"127.0.0.1:{replicas[1].server_port}"}
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(REPO / "deploy" / "haproxy.cfg")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # both replicas seen up by the health checks
            with contextlib.suppress(httpx.TransportError):
                if {httpx.get(f"{base}/v1/models").text for _ in range(6)} == {"replica1", "replica2"}:
                    break
            assert time.monotonic() < deadline and proxy.poll() is None, "the proxy did not come up"
            time.sleep(0.2)
        yield base, replicas
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        for replica in replicas:
            replica.shutdown()
            replica.server_close()


def test_a_sessions_later_requests_go_to_the_replica_that_answered_it_else_where_the_hash_of_its_key_points():
    with proxy_and_replicas() as (base, replicas):
        def routed(query: str) -> str:
            return httpx.get(f"{base}/v1/realtime?model=m&{query}").text

        # Keys the table does not know: each always to the same replica, and the keys spread over both.
        hashed = {f"sess_{n}": routed(f"session_id=sess_{n}") for n in range(24)}
        assert all(routed(f"session_id={key}") == replica for key, replica in list(hashed.items())[:6])
        assert set(hashed.values()) == {"replica1", "replica2"}
        assert routed("call_id=sess_3") == hashed["sess_3"]  # a call's sideband is keyed the same way

        # A new session's id, learned from the answering replica, wins over the hash of that id:
        # each replica names a session whose id hashes to the other one.
        to_other = {replica: next(key for key, hashed_to in hashed.items() if hashed_to != replica.name) for replica in replicas}
        for replica, key in to_other.items():
            replica.next_session_id = key
        answered = httpx.get(f"{base}/v1/realtime?model=m").text
        learned = next(key for replica, key in to_other.items() if replica.name == answered)
        assert hashed[learned] != answered
        assert routed(f"session_id={learned}") == answered
        assert routed(f"call_id={learned}") == answered
