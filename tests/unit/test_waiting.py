"""``harness.waiting.wait_for``: returns the first truthy value, and gives up bounded in time and in
count, naming what it waited for."""

from __future__ import annotations

import pytest

from dataplane.errors import PDPairError
from dataplane.harness import waiting
from dataplane.harness.waiting import WaitTimeout, wait_for


def test_returns_the_first_truthy_value():
    values = iter([0, None, "", {"ready": True}])
    assert wait_for("ready", lambda: next(values), timeout=5, interval=0.001) == {"ready": True}


def test_a_timeout_names_what_was_awaited_and_the_last_value():
    with pytest.raises(WaitTimeout, match=r"after 0.05s waiting for the decode pod; last: \[\]") as err:
        wait_for("the decode pod", lambda: [], timeout=0.05, interval=0.01)
    assert isinstance(err.value, PDPairError) and isinstance(err.value, AssertionError)


def test_bounded_in_count_when_the_clock_stands_still(monkeypatch):
    calls = []
    monkeypatch.setattr(waiting.time, "monotonic", lambda: 100.0)
    monkeypatch.setattr(waiting.time, "sleep", lambda _: None)
    with pytest.raises(WaitTimeout):
        wait_for("nothing", lambda: calls.append(1), timeout=1.0, interval=0.1)
    assert len(calls) == 12  # timeout / interval + 2


def test_a_zero_timeout_checks_once():
    calls = []
    with pytest.raises(WaitTimeout):
        wait_for("once", lambda: calls.append(1), timeout=0)
    assert calls == [1]


def test_nonsense_bounds_are_refused():
    with pytest.raises(ValueError, match="interval 0"):
        wait_for("x", lambda: True, timeout=1, interval=0)
