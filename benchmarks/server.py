"""The server under test: started as a subprocess (or reached at `--url`), and watched with psutil.

`ManagedServer` runs `python -m session_server.cli serve --enable-realtime --host 127.0.0.1
--port <free>` with a profile derived from `--config` (the embedded default when none) whose
`limits.max_sessions` is raised to the largest session count the run needs and whose
`limits.first_audio_goal_ms` is off, so admission does not refuse the load it was asked to
measure, and whose WebRTC candidates are loopback only. It waits for `/health` to answer 200, and on exit
sends SIGTERM (the server drains), then kills it if it has not exited in time. The server's
log and the profile it served go to files next to the JSON report, not to the table on stdout.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from graph.sched import policy_of


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_profile(config: str | None, max_sessions: int, max_seq_len: int | None = None,
                  kv_cache: str | None = None) -> dict[str, Any]:
    """The profile to serve: `config` (or the embedded default) with room for `max_sessions`;
    `max_seq_len` lowers the thinker's context (every model resource's and `limits.max_seq_len`);
    `kv_cache` (auto | preallocate | grow) sets every model resource's, and `preallocate` sizes
    the KV budget to `max_sessions` rows of the longest context, allocated at start as on CUDA."""
    from configs import load_profile
    from graph.limits import SessionLimits

    profile = load_profile(config)
    limits = profile.setdefault("limits", {})
    if max_seq_len is not None:
        limits["max_seq_len"] = max_seq_len
        for resource in profile.get("resources", {}).values():
            if isinstance(resource, dict) and resource.get("type") == "qwen3_omni.model":
                resource.setdefault("params", {})["max_seq_len"] = max_seq_len
    limits["max_sessions"] = max(int(limits.get("max_sessions", SessionLimits.max_sessions)), max_sessions)
    # A bench measures the load it asks for, past the point where admission by load would refuse it.
    limits["first_audio_goal_ms"] = None
    if limits.get("kv_tokens") and limits.get("max_seq_len"):
        needed = max_sessions * int(limits["max_seq_len"])
        if needed > int(limits["kv_tokens"]):
            limits["kv_tokens"] = needed
            # A budget raised for admission is not memory the device has: the KV caches grow with
            # what the levels use instead of holding every row of the longest context from the start.
            for resource in profile.get("resources", {}).values():
                if isinstance(resource, dict) and resource.get("type") == "qwen3_omni.model":
                    resource.setdefault("params", {})["kv_cache"] = "grow"
    if kv_cache is not None:
        models = [r for r in profile.get("resources", {}).values() if isinstance(r, dict) and r.get("type") == "qwen3_omni.model"]
        for resource in models:
            resource.setdefault("params", {})["kv_cache"] = kv_cache
        if kv_cache == "preallocate":
            from nodes.qwen3_omni.bounds import ReplyBounds

            longest = limits.get("max_seq_len") or max(
                (int(r.get("params", {}).get("max_seq_len") or ReplyBounds.max_seq_len) for r in models), default=ReplyBounds.max_seq_len)
            limits.update(max_seq_len=int(longest), kv_tokens=max_sessions * int(longest))
    # The server binds 127.0.0.1 and so does the harness's WebRTC client: media stays on loopback.
    webrtc = profile.get("webrtc")
    profile["webrtc"] = {**(webrtc if isinstance(webrtc, dict) else {}), "candidates": "loopback"}
    return profile


@dataclass
class ServerHandle:
    base_url: str
    pid: int | None  # None when the server is not ours to watch (a remote --url)
    model_id: str
    log_path: str | None = None
    started_by_harness: bool = False
    startup_s: float | None = None
    profile_path: str | None = None  # the profile it serves (when the harness wrote it)

    @property
    def ws_url(self) -> str:
        return "ws" + self.base_url[len("http") :]


class ServerStartError(RuntimeError):
    pass


class ManagedServer:
    """A server subprocess for the length of a `with` block."""

    def __init__(self, config: str | None, max_sessions: int, log_path: Path, api_key: str | None = None, startup_timeout_s: float = 300.0,
                 unit_trace: str | None = None, sched: str | None = None, max_seq_len: int | None = None, sip: dict[str, Any] | None = None,
                 kv_cache: str | None = None):
        self.config = config
        self.kv_cache = kv_cache
        self.sip = sip  # the profile's `sip:` section, served with `--sip <its listen>`
        self.max_seq_len = max_seq_len
        self.sched = sched
        self.unit_trace = unit_trace
        self.max_sessions = max_sessions
        self.log_path = log_path
        self.api_key = api_key
        self.startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self.profile_path: Path | None = None

    def __enter__(self) -> ServerHandle:
        import yaml

        profile = bench_profile(self.config, self.max_sessions, self.max_seq_len, self.kv_cache)
        if self.unit_trace:
            profile.setdefault("compute", {})["unit_trace"] = str(Path(self.unit_trace).resolve())
        if self.sip:
            profile["sip"] = self.sip
        # Kept beside the log: the exact profile that was measured.
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.profile_path = self.log_path.with_name(self.log_path.stem.removesuffix("-server") + "-profile.yaml")
        self.profile_path.write_text(yaml.safe_dump(profile, sort_keys=False))
        port = free_port()
        command = [sys.executable, "-m", "session_server.cli", "serve", "--enable-realtime", "--host", "127.0.0.1", "--port", str(port), "--config", str(self.profile_path), "--log-level", "warning"]
        if self.api_key:
            command += ["--api-key", self.api_key]
        if self.sched:
            command += ["--server-sched", self.sched]
        if self.sip:
            command += ["--sip", self.sip["listen"]]
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child, closed with it
        started = time.perf_counter()
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        base_url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(base_url, self._process, self.startup_timeout_s, self.log_path)
        except BaseException:
            self._stop()
            raise
        return ServerHandle(base_url, self._process.pid, str(profile.get("model_id", "")), str(self.log_path), True, round(time.perf_counter() - started, 2), str(self.profile_path))

    def __exit__(self, *exc_info: Any) -> None:
        self._stop()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _wait_healthy(base_url: str, process: subprocess.Popen[bytes], timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServerStartError(f"the server exited with code {process.returncode} during startup; log: {log_path}\n{_tail(log_path)}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(base_url + "/health").status_code == 200:
                    return
            time.sleep(0.2)
    raise ServerStartError(f"the server was not healthy after {timeout_s:.0f}s; log: {log_path}\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The request headers that carry the server's API key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def remote_model_id(base_url: str, api_key: str | None) -> str:
    response = httpx.get(base_url + "/v1/models", headers=auth_headers(api_key), timeout=10)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


@dataclass
class ResourceSample:
    cpu_percent: float  # of one core (100 = one core busy)
    rss_mb: float
    machine_cpu_percent: float  # all processes on the machine, of all cores (100 = every core busy)
    sched: str | None  # the watched process's scheduling policy (graph/sched.py), None where unknown


@dataclass
class ResourceMonitor:
    """Samples a process's CPU and resident memory (children included) every `interval_s`.

    Used as `with ResourceMonitor(pid) as monitor: ...`; `summary()` reports the mean CPU and
    the peak RSS over the block, beside the RSS measured just before it (the baseline).
    """

    pid: int | None
    interval_s: float = 0.5
    include_children: bool = True
    samples: list[ResourceSample] = field(default_factory=list)
    baseline_rss_mb: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> ResourceMonitor:
        if self.pid is None:
            return self
        import psutil

        try:
            self._process = psutil.Process(self.pid)
            self.baseline_rss_mb = self._rss_mb()
            self._cpu_times = self.cpu_seconds()
            self._cpu_at = time.perf_counter()
            psutil.cpu_percent()  # starts the machine-wide measurement window
        except psutil.Error:
            self.pid = None
            return self
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _processes(self) -> list[Any]:
        import psutil

        if self.include_children:
            with contextlib.suppress(psutil.Error):
                return [self._process, *self._process.children(recursive=True)]
        return [self._process]

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the watched process(es) have used so far, seconds."""
        import psutil

        total = 0.0
        for process in self._processes():
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def rss_mb(self) -> float:
        """Resident memory now, MB (children included), inside the `with` block."""
        return self._rss_mb()

    def _rss_mb(self) -> float:
        import psutil

        total = 0
        for process in self._processes():
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total / 2**20

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(self.interval_s):
            now = time.perf_counter()
            cpu = self.cpu_seconds()
            percent = 100.0 * (cpu - self._cpu_times) / max(now - self._cpu_at, 1e-6)
            self._cpu_times, self._cpu_at = cpu, now
            self.samples.append(ResourceSample(percent, self._rss_mb(), psutil.cpu_percent(), policy_of(self.pid)))

    def summary(self, sessions: int) -> dict[str, float | None]:
        if self.pid is None or not self.samples:
            return {"cpu_percent": None, "cpu_percent_per_session": None, "rss_mb": None, "rss_mb_baseline": None, "rss_mb_per_session": None, "machine_cpu_percent": None,
                    "sched_batch_share": None}
        cpu = sum(s.cpu_percent for s in self.samples) / len(self.samples)
        peak = max(s.rss_mb for s in self.samples)
        baseline = self.baseline_rss_mb or peak
        return {
            "cpu_percent": round(cpu, 1),
            "cpu_percent_per_session": round(cpu / max(sessions, 1), 1),
            "rss_mb": round(peak, 1),
            "rss_mb_baseline": round(baseline, 1),
            "rss_mb_per_session": round(max(peak - baseline, 0.0) / max(sessions, 1), 2),
            # Everything on the machine (the harness, the server, anything else running).
            "machine_cpu_percent": round(sum(s.machine_cpu_percent for s in self.samples) / len(self.samples), 1),
            # How much of the block the server process ran as SCHED_BATCH (`--server-sched adaptive`
            # switches with the machine's load).
            "sched_batch_share": self._batch_share(),
        }

    def _batch_share(self) -> float | None:
        known = [s.sched for s in self.samples if s.sched is not None]
        return round(known.count("batch") / len(known), 2) if known else None

    def cpu_percent(self) -> float | None:
        """Mean CPU of the watched process(es), % of one core."""
        if self.pid is None or not self.samples:
            return None
        return round(sum(s.cpu_percent for s in self.samples) / len(self.samples), 1)
