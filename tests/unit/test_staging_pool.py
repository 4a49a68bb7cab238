"""Staging slots: bounded, reused, back-pressure with a deadline, misuse refused."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dataplane.errors import BadInput, DeadlineExceeded
from dataplane.staging import SlotPool


def test_slots_are_bounded_and_reused() -> None:
    pool = SlotPool(2, 8, np.zeros(16, np.uint8))
    a, b = pool.try_acquire(), pool.try_acquire()
    assert {a, b} == {0, 1} and pool.try_acquire() is None and pool.available == 0
    pool.release(a)
    assert pool.try_acquire() == a
    assert pool.offset(1) == 8
    pool.view(1)[:] = 7
    assert pool.buffer[8:].tolist() == [7] * 8 and pool.buffer[:8].tolist() == [0] * 8


def test_full_pool_raises_deadline_exceeded_after_waiting() -> None:
    pool = SlotPool(1, 4)
    pool.acquire(time.monotonic() + 1)
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="busy"):
        pool.acquire(start + 0.05)
    assert time.monotonic() - start >= 0.05


def test_waiter_wakes_when_a_slot_is_released() -> None:
    pool = SlotPool(1, 4)
    slot = pool.acquire(time.monotonic() + 1)
    timer = threading.Timer(0.05, pool.release, args=(slot,))
    timer.start()
    try:
        assert pool.acquire(time.monotonic() + 5) == slot
    finally:
        timer.join()


def test_misuse_is_refused() -> None:
    with pytest.raises(BadInput):
        SlotPool(0, 4)
    with pytest.raises(BadInput, match="bytes"):
        SlotPool(4, 8, np.zeros(16, np.uint8))
    pool = SlotPool(2, 4)
    with pytest.raises(BadInput, match="not in use"):
        pool.release(0)
    with pytest.raises(BadInput, match="not in use"):
        pool.release(5)
    with pytest.raises(BadInput, match="credit-only"):
        pool.view(0)
