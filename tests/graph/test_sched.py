"""Scheduling policies (graph/sched.py): the server yields on wake-up, the engines do not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from graph import sched

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
