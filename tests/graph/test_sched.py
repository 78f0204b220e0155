"""Scheduling policies (graph/sched.py): the server yields on wake-up, the engines do not."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from graph import sched
from tests.conftest import wait_until

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")


@pytest.fixture
def restore_policy():
    policy, params = os.sched_getscheduler(0), os.sched_getparam(0)
    yield
    os.sched_setscheduler(0, policy, params)


def test_apply_switches_the_calling_thread_and_says_what_is_in_effect(restore_policy):
    assert sched.apply("batch") == "batch"
    assert os.sched_getscheduler(0) == os.SCHED_BATCH and sched.policy_of(0) == "batch"
    assert sched.apply("normal") == "normal"
    assert os.sched_getscheduler(0) == os.SCHED_OTHER and sched.policy_of(0) == "normal"


def test_apply_to_process_switches_threads_started_before_it_too(restore_policy):
    sched.apply("normal")  # what the worker inherits
    switch, seen = threading.Event(), []
    worker = threading.Thread(target=lambda: (seen.append(sched.policy_of(0)), switch.wait(5), seen.append(sched.policy_of(0))))
    worker.start()
    try:
        wait_until(lambda: seen, "the worker to read its policy", timeout=5)
        assert sched.apply_to_process("batch") == "batch"
        switch.set()
        worker.join(5)
        assert seen == ["normal", "batch"] and sched.policy_of(0) == "batch"
    finally:
        switch.set()
        sched.apply_to_process("normal")


def test_a_process_started_by_a_batch_server_inherits_it_and_compute_puts_itself_back(restore_policy):
    probe = "import os; from graph import sched; print(sched.policy_of(0)); sched.normal_for_compute(); print(sched.policy_of(0))"
    sched.apply("batch")
    lines = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert lines == ["batch", "normal"]


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown scheduling policy 'fifo'"):
        sched.apply("fifo")


def test_the_policy_of_a_process_that_is_gone_is_unknown():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert sched.policy_of(process.pid) is None and sched.policy_of(None) is None


class FakeLoad:
    def __init__(self, *shares: float | None):
        self.shares = list(shares)

    def __call__(self) -> float | None:
        return self.shares.pop(0)


def test_adaptive_starts_normal_and_switches_only_past_its_thresholds():
    switched: list[str] = []

    def set_policy(policy: str) -> str:
        switched.append(policy)
        return policy

    adaptive = sched.AdaptivePolicy(FakeLoad(0.3, 0.45, 0.3, None, 0.2, 0.1), set_policy)
    assert adaptive.policy == "normal" and switched == ["normal"]
    # 0.3 is between the thresholds (keeps normal); 0.45 is above BATCH_ABOVE; 0.3 keeps batch;
    # no reading keeps it; 0.2 is below NORMAL_BELOW.
    assert [adaptive.step() for _ in range(6)] == ["normal", "batch", "batch", "batch", "normal", "normal"]
    assert switched == ["normal", "batch", "normal"]  # a switch only when the policy changes


def test_adaptive_keeps_what_the_platform_left_in_effect():
    adaptive = sched.AdaptivePolicy(FakeLoad(0.9, 0.9), lambda policy: "normal")  # SCHED_BATCH refused
    assert adaptive.step() == "normal"


def test_machine_load_is_the_busy_share_of_all_cores_between_two_readings(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal ...
    stat.write_text("cpu  100 0 50 800 50 0 0 7 0 0\ncpu0 50 0 25 400 25 0 0 3 0 0\n")
    load = sched.MachineLoad(str(stat))
    stat.write_text("cpu  160 0 70 880 70 5 5 99 0 0\ncpu0 80 0 35 440 35 2 3 50 0 0\n")
    # busy +90 (user 60, system 20, irq 5, softirq 5), idle +80, iowait +20; steal is not counted
    assert load.busy_share() == pytest.approx(90 / 190)
    assert load.busy_share() is None  # no ticks since the last reading


def test_machine_load_without_proc_stat_is_unknown(tmp_path):
    assert sched.MachineLoad(str(tmp_path / "missing")).busy_share() is None
