"""The role worker's loop settings that do not need a peer."""

from __future__ import annotations

import ctypes
import sys
import threading

import pytest

from dataplane.agent.roles import tight_timers

PR_GET_TIMERSLACK = 30


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is a Linux setting")
def test_the_worker_thread_sleeps_with_tight_timers_and_others_keep_theirs():
    prctl = ctypes.CDLL(None).prctl
    seen = {}

    def worker():
        seen["before"] = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
        tight_timers()
        seen["after"] = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)

    t = threading.Thread(target=worker)
    t.start()
    t.join(5)
    assert seen["after"] == 1 and seen["before"] > 1
    assert prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == seen["before"]  # per thread: this one is untouched
