"""``FaultyTransport``: each kind of fault does what the fault matrix relies on, over a real adapter (MoRI
over its hardware test double, both engines in this process), and a bad ``PDPAIR_TEST_FAULTS`` is one
line naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from dataplane.errors import BadInput, DeadlineExceeded, TransferFailed
from dataplane.transports import MemoryRegion, Peer, TransferState, Writes, mori_double
from dataplane.transports.faulty import FaultPlan, FaultyTransport
from dataplane.transports.mori import MoriTransport

SIZE = 1 << 16
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def faulty(plan: FaultPlan) -> Iterator[tuple[FaultyTransport, Peer, np.ndarray, np.ndarray]]:
    keys = [f"{role}-{uuid.uuid4().hex[:8]}" for role in ("me", "peer")]
    inner = MoriTransport(keys[0], "127.0.0.1", sdk=mori_double)
    far = MoriTransport(keys[1], "127.0.0.1", sdk=mori_double)
    local = np.arange(SIZE, dtype=np.uint8)
    remote = np.zeros(SIZE, dtype=np.uint8)
    me = FaultyTransport(inner, plan)
    try:
        me.register([MemoryRegion(local.ctypes.data, SIZE)])
        blobs = far.register([MemoryRegion(remote.ctypes.data, SIZE)])
        yield me, me.connect("peer", far.endpoint(), blobs), local, remote
    finally:
        me.close()
        far.close()


def one_write(size: int = SIZE) -> Writes:
    r, at = np.array([0], np.int32), np.array([0])
    return Writes(r, at, r, at, np.array([size]))


def test_without_faults_it_is_the_inner_transport() -> None:
    with faulty(FaultPlan()) as (me, peer, local, remote):
        t = me.write(peer, one_write())
        me.wait(t, time.monotonic() + 5)
        assert np.array_equal(remote, local)
        counters = me.describe()["faults"]
        assert counters["writes"] == 1 and not any(counters["injected"].values())


def test_submit_fault_refuses_the_write() -> None:
    with faulty(FaultPlan(rate=1.0, kinds=("submit",))) as (me, peer, _, remote):
        with pytest.raises(TransferFailed, match="refused at submit"):
            me.write(peer, one_write())
        assert not remote.any()


def test_corrupt_fault_fails_a_finished_transfer() -> None:
    with faulty(FaultPlan(rate=1.0, kinds=("corrupt",))) as (me, peer, _, _remote):
        t = me.write(peer, one_write())
        with pytest.raises(TransferFailed, match="corrupted completion"):
            me.wait(t, time.monotonic() + 5)
        assert t.state is TransferState.FAILED and not me._fates


def test_lost_completion_runs_into_the_deadline_and_is_forgotten() -> None:
    with faulty(FaultPlan(rate=1.0, kinds=("lose",))) as (me, peer, local, remote):
        t = me.write(peer, one_write())
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            me.wait(t, start + 0.3)
        assert time.monotonic() - start >= 0.3
        assert np.array_equal(remote, local)  # the engine's copy ran; only its completion was lost
        assert not me._fates  # the deadline's abort released it


def test_delayed_completion_arrives_late() -> None:
    with faulty(FaultPlan(rate=1.0, kinds=("delay",), delay=0.25)) as (me, peer, local, remote):
        start = time.monotonic()
        t = me.write(peer, one_write())
        me.wait(t, start + 5)
        assert time.monotonic() - start >= 0.25 and np.array_equal(remote, local)


def test_fail_after_n_fails_every_later_write() -> None:
    with faulty(FaultPlan(fail_after=2)) as (me, peer, _, _remote):
        for _ in range(2):
            me.wait(me.write(peer, one_write()), time.monotonic() + 5)
        for _ in range(3):
            with pytest.raises(TransferFailed, match="broken after 2 writes"):
                me.write(peer, one_write())


def test_a_seed_draws_the_same_faults() -> None:
    def kinds(seed: int) -> list[str]:
        plan = FaultPlan(rate=0.3, seed=seed, kinds=("submit", "delay"), delay=0.0)
        with faulty(plan) as (me, peer, _, _r):
            out = []
            for _ in range(40):
                try:
                    t = me.write(peer, one_write(64))
                    me.wait(t, time.monotonic() + 5)
                    out.append("ok")
                except TransferFailed:
                    out.append("submit")
            return out

    first = kinds(7)
    assert first == kinds(7) and "submit" in first and "ok" in first


def test_plan_parses_and_names_the_mistake() -> None:
    plan = FaultPlan.parse("rate=0.3, seed=7,kinds=submit+lose,delay=0.5,fail_after=9")
    assert plan == FaultPlan(rate=0.3, seed=7, kinds=("submit", "lose"), delay=0.5, fail_after=9)
    for text, words in [
        ("rate=lots", ["'rate=lots'"]),
        ("rate=1.5", ["rate must lie in [0, 1]"]),
        ("kinds=submit+explode", ["submit+corrupt+lose+delay", "explode"]),
        ("speed=3", ["'speed=3'"]),
        ("rate", ["'rate'"]),
    ]:
        with pytest.raises(BadInput) as err:
            FaultPlan.parse(text)
        line = str(err.value)
        assert "\n" not in line and line.startswith(f"PDPAIR_TEST_FAULTS={text!r}"), line
        assert all(w in line for w in words), line


def test_agent_run_with_a_bad_fault_plan_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("listen:\n  host: 127.0.0.1\n")
    env = {
        **os.environ, "PDPAIR_TEST_FAULTS": "rate=2",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "dataplane.cli", "run", "--role", "prefill", "--config", str(config)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "PDPAIR_TEST_FAULTS='rate=2'" in lines[0], lines[0]
