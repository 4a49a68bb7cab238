"""``wait_for``: the one bounded poll the harness and the tests use — until a check is truthy, bounded in
time and in the number of checks, failing with what was awaited and the last value seen."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import PDPairError

T = TypeVar("T")


class WaitTimeout(PDPairError, AssertionError):
    """What was awaited did not happen in time. An ``AssertionError`` too, so a test reads it as a
    failed expectation."""


def wait_for(what: str, check: Callable[[], T], timeout: float = 60.0, interval: float = 0.1) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something truthy and return that; after
    ``timeout`` seconds (and at most ``timeout / interval + 2`` calls) raise ``WaitTimeout`` naming
    ``what`` and the last value."""
    if timeout < 0 or interval <= 0:
        raise ValueError(f"wait_for({what!r}): timeout {timeout} must be >= 0 and interval {interval} > 0")
    deadline = time.monotonic() + timeout
    last: T | None = None
    for _ in range(math.ceil(timeout / interval) + 2):
        last = check()
        if last:
            return last
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(interval, left))
    raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")
