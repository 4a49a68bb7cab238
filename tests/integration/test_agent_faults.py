"""Real agents under faults, at the default liveness settings (heartbeat 1 s x 5 misses): each test is a
row of the fault matrix (``scripts/faults``).

A fault-injecting transport (``dataplane.transports.faulty``, selected by ``PDPAIR_TEST_FAULTS``) under
load: no crash, ``/healthz`` OK throughout, and every failed room counted exactly once — in each agent's
``/metrics``, its ``/status`` and decode's synthetic engine. A peer killed, a peer frozen: each
detected and its rooms failed within the bound the issue sets.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import zmq
from faults_support import FaultRow
from prometheus_client.parser import text_string_to_metric_families

from dataplane.codec import encode_manifest, manifest_from_schema
from dataplane.config import AgentConfig, ModelConfig, NixlConfig, SyntheticConfig, TransferConfig
from dataplane.harness.agent_processes import AgentProcess, loopback_pair
from dataplane.harness.sidecar_pair import SidecarPair
from dataplane.harness.waiting import wait_for
from dataplane.localapi import AgentClient, SharedPools
from dataplane.schema.profiles import schema_from_config
from dataplane.transports.faulty import KINDS

pytestmark = [pytest.mark.nixl, pytest.mark.slow, pytest.mark.faults]

DEFAULTS = TransferConfig()
HEARTBEAT, MISSES = DEFAULTS.heartbeat_interval_seconds, DEFAULTS.heartbeat_misses
DETECT_BOUND = HEARTBEAT * MISSES + 1.0
"""A dead peer is declared down within heartbeat x misses + 1 s."""


def config(
    requests: int, transfer: TransferConfig = DEFAULTS, rps: float = 0.0,
    tokens: tuple[int, ...] = (700, 0, 2048),
) -> AgentConfig:
    return AgentConfig(
        model=ModelConfig(profile="qwen3-next", pool_pages=128, max_requests=8),
        transfer=transfer,
        synthetic=SyntheticConfig(requests_per_second=rps, requests=requests, tokens=tokens, max_inflight=3),
    )


@contextmanager
def pair(tmp_path: Path, cfg: AgentConfig, prefill_env: dict[str, str] | None = None,
         ) -> Iterator[tuple[AgentProcess, AgentProcess]]:
    (pcfg,), (dcfg,) = loopback_pair(cfg)
    prefill = AgentProcess(pcfg, tmp_path, "prefill", env=prefill_env)
    decode = AgentProcess(dcfg, tmp_path, "decode")
    try:
        prefill.wait_ready()
        decode.wait_ready()
        yield prefill, decode
    finally:
        decode.stop()
        prefill.stop()



def healthy(agent: AgentProcess) -> bool:
    with urllib.request.urlopen(agent.url + "/healthz", timeout=2) as reply:
        return reply.status == 200 and b"true" in reply.read()


def outcomes_in_metrics(agent: AgentProcess) -> Counter[str]:
    """``pdpair_agent_requests_total`` summed by outcome."""
    with urllib.request.urlopen(agent.url + "/metrics", timeout=2) as reply:
        text = reply.read().decode()
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "pdpair_agent_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["outcome"]] += int(sample.value)
    return out


@pytest.mark.parametrize(
    ("faults", "rooms"),
    [("rate=0.05,seed=5", 60), ("rate=0.3,seed=27", 60), ("fail_after=20,seed=1", 40)],
    ids=["rate-0.05", "rate-0.3", "fail-after-20"],
)
def test_injected_transport_faults_fail_each_room_once(tmp_path: Path, fault_row: FaultRow, faults: str,
                                                       rooms: int) -> None:
    """Prefill's engine refuses, loses, corrupts and delays writes: every room still ends exactly once,
    counted alike by both agents' metrics, their ``/status`` and decode's engine, and both stay healthy."""
    timeout = 2.0  # lost completions cost the deadline; this row is about accounting, not the bound
    fault_row.fault = f"transport faults ({faults})"
    fault_row.injected = "FaultyTransport around prefill's NIXL: submit failures, corrupted/lost/delayed " \
                         "completions, fail-after-N"
    fault_row.bound = "no crash; /healthz OK; each failed room counted once (metrics, /status, engine)"
    cfg = config(rooms, msgspec.structs.replace(DEFAULTS, timeout_seconds=timeout))
    with pair(tmp_path, cfg, {"PDPAIR_TEST_FAULTS": faults}) as (prefill, decode):
        started = time.monotonic()

        def done() -> bool:
            assert prefill.proc.poll() is None and decode.proc.poll() is None, "an agent crashed"
            assert healthy(prefill) and healthy(decode), "/healthz not OK"
            return bool(decode.status()["requests"]["completed"] >= rooms)

        wait_for(f"{rooms} rooms", done, timeout=90, interval=0.2)
        wait_for("prefill idle", lambda: prefill.status()["rooms"]["inflight"] == 0, timeout=timeout * 2)
        took = time.monotonic() - started
        d, p = decode.status(), prefill.status()
        counters = p["transport"]["faults"]
        injected = counters["injected"]
        assert sum(injected.values()) > 0, p["transport"]
        engine = d["requests"]
        assert engine["completed"] == rooms and engine["verification_failures"] == 0, engine
        d_fin, p_fin = Counter(d["rooms"]["finished"]), Counter(p["rooms"]["finished"])
        failed = engine["completed"] - engine["succeeded"]
        assert failed > 0, (engine, injected)
        assert d_fin == Counter(success=engine["succeeded"], failed=failed) - Counter(), (d_fin, engine)
        # prefill failed the room itself, or decode's deadline did and its Abort told prefill
        assert p_fin["success"] == engine["succeeded"], (p_fin, engine)
        assert p_fin["failed"] + p_fin["aborted"] == failed, (p_fin, engine)
        assert outcomes_in_metrics(decode) == d_fin, (outcomes_in_metrics(decode), d_fin)
        assert outcomes_in_metrics(prefill) == p_fin, (outcomes_in_metrics(prefill), p_fin)
        if "rate=0.3" in faults:  # this seed meets every kind within the first rooms' writes
            assert {k for k, v in injected.items() if v} == set(KINDS), injected
        if "fail_after" in faults:
            assert injected["submit"] == counters["writes"] - 20 > 0, counters  # every write after the 20th
        assert d["prefill"]["0"]["state"] == "paired" and healthy(prefill) and healthy(decode)
        fault_row.observed = (
            f"{rooms} rooms in {took:.1f} s: {engine['succeeded']} ok, {failed} failed; injected "
            + ", ".join(f"{k} {v}" for k, v in injected.items() if v)
            + "; counts agree"
        )
    assert prefill.proc.returncode == 0 and decode.proc.returncode == 0, "an agent exited with an error"


def peer_entry(agent: AgentProcess) -> dict[str, Any]:
    peers = agent.status()["peers"]
    return dict(next(iter(peers.values()))) if peers else {}


@pytest.mark.parametrize("victim", ["prefill", "decode"])
def test_killed_peer_detected_within_heartbeat_bound(
    tmp_path: Path, fault_row: FaultRow, victim: str
) -> None:
    """SIGKILL one agent mid-load: the survivor declares it down within heartbeat x misses + 1 s (its own
    clock) and fails every room it held with it at once — decode's engine counts them within 1 s."""
    fault_row.fault = f"{victim} killed under load"
    fault_row.injected = f"SIGKILL of the {victim} agent, rooms in flight"
    fault_row.bound = f"down ≤ {DETECT_BOUND:.0f} s (heartbeat {HEARTBEAT:g} s x {MISSES}); engine told ≤ 1 s"
    with pair(tmp_path, config(0, rps=5, tokens=(700,))) as (prefill, decode):
        wait_for("first rooms", lambda: decode.status()["requests"]["succeeded"] >= 3, timeout=30)
        dead, survivor = (prefill, decode) if victim == "prefill" else (decode, prefill)
        wait_for("a room in flight",
                 lambda: survivor.status()["rooms"]["inflight"] > 0, timeout=10, interval=0.01)
        before = Counter(survivor.status()["rooms"]["finished"])
        dead.signal(signal.SIGKILL)
        killed = time.time()

        def told() -> float | None:
            st = survivor.status()
            peer = peer_entry(survivor)
            lost = Counter(st["rooms"]["finished"]) - before
            counted = lost["failed"] > 0 or victim == "decode"  # decode's NIXL may fail them first
            if peer.get("state") == "down" and st["rooms"]["inflight"] == 0 and counted:
                return time.time()
            return None

        told_at = wait_for(f"{victim} down", told, timeout=DETECT_BOUND + 5, interval=0.05)
        peer = peer_entry(survivor)
        detected = peer["since"] - killed
        fault_row.observed = f"down after {detected:.2f} s, engine told {told_at - peer['since']:.2f} s later"
        assert "heartbeat lost" in peer["reason"], peer
        assert detected <= DETECT_BOUND, (detected, peer)
        assert told_at - peer["since"] <= 1.0, fault_row.observed
        st = survivor.status()
        if victim == "prefill":
            last = st["rooms"]["recent_failures"][-1]
            assert "heartbeat lost" in last["reason"], st["rooms"]
            engine = st["requests"]
            assert engine["completed"] == engine["succeeded"] + Counter(st["rooms"]["finished"])["failed"]
        assert healthy(survivor)


REPAIR_WITHIN = HEARTBEAT
"""Once decode runs again it sees that it stalled past the heartbeat limit (prefill has dropped the
pairing) and registers at once: paired again within a heartbeat."""


def test_frozen_decode_fails_rooms_by_deadline_without_holding_prefill(
    tmp_path: Path, fault_row: FaultRow
) -> None:
    """A decode frozen (SIGSTOP) while prefill writes to it over TCP: prefill's rooms with it fail no later
    than the transfer deadline + 10% (heartbeat loss comes first at the defaults) — failed by prefill's
    worker itself, which a worker held in a write could not do — ``/healthz`` stays OK, and once decode
    runs again the two pair again within a heartbeat."""
    deadline = DEFAULTS.timeout_seconds
    fault_row.fault = "decode frozen mid-transfer"
    fault_row.injected = "SIGSTOP of the decode agent while prefill holds rooms (UCX over TCP)"
    fault_row.bound = (f"prefill's rooms failed ≤ {deadline * 1.1:.0f} s (deadline + 10%); worker never "
                       f"held; re-paired ≤ {REPAIR_WITHIN:g} s after SIGCONT")
    tcp = msgspec.structs.replace(DEFAULTS, nixl=NixlConfig(ucx_tls="tcp", ucx_net_devices="lo"))
    with pair(tmp_path, config(0, tcp, tokens=(4096,))) as (prefill, decode):
        wait_for("first rooms", lambda: decode.status()["requests"]["succeeded"] >= 2, timeout=30)
        for _ in range(20):  # freeze decode at a moment prefill holds a room (nearly always the first)
            decode.signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            stuck = prefill.status()["rooms"]
            if stuck["inflight"]:
                break
            decode.signal(signal.SIGCONT)
            time.sleep(0.05)
        else:
            pytest.fail("prefill never held a room when decode froze")
        try:
            def freed() -> bool:
                assert healthy(prefill)
                return bool(prefill.status()["rooms"]["inflight"] == 0)

            wait_for("prefill's rooms freed", freed, timeout=deadline * 1.1 + 2)
            freed_after = time.monotonic() - frozen_at
            failures = prefill.status()["rooms"]["recent_failures"]
            assert len(failures) >= stuck["inflight"], failures
            assert all(f["after_seconds"] <= deadline * 1.1 for f in failures), failures
            assert freed_after <= deadline * 1.1, freed_after
            # Prefill dropped decode a heartbeat limit after decode's last beat, and decode's last turn
            # may have come up to a beat later: frozen one limit more, the stall decode sees on waking is
            # past the limit in any phase, so it registers again at once.
            tr = decode.cfg.transfer
            time.sleep(tr.heartbeat_interval_seconds * tr.heartbeat_misses)
        finally:
            decode.signal(signal.SIGCONT)
        resumed = time.time()
        wait_for("prefill paired with decode again",
                 lambda: peer_entry(prefill).get("state") == "paired", timeout=DETECT_BOUND + 5,
                 interval=0.05)
        repaired = peer_entry(prefill)["since"] - resumed
        fault_row.observed = (
            f"{stuck['inflight']} room(s) failed {freed_after:.1f} s after the freeze "
            f"({failures[-1]['reason'].split(':')[0]}); re-paired {repaired:.2f} s after SIGCONT"
        )
        assert repaired <= REPAIR_WITHIN, fault_row.observed
        assert healthy(prefill) and healthy(decode)


def test_replaced_prefill_pairs_within_a_heartbeat_of_ready(tmp_path: Path, fault_row: FaultRow) -> None:
    """Prefill replaced behind the same bootstrap address (a new pod behind the Service): decode pairs
    with the new instance within one heartbeat of the new prefill being ready (its ready file, written
    once every listener is bound), and rooms flow again."""
    fault_row.fault = "prefill replaced behind the same bootstrap address"
    fault_row.injected = "SIGTERM of prefill, a new prefill process started on the same bootstrap port"
    fault_row.bound = f"decode paired with the new instance ≤ {HEARTBEAT:g} s after it is ready"
    with pair(tmp_path, config(0, rps=10, tokens=(700,))) as (prefill, decode):
        wait_for("first rooms", lambda: decode.status()["requests"]["succeeded"] >= 2, timeout=30)
        old = decode.status()["prefill"]["0"]["instance"]
        prefill.stop()
        stopped_at = time.time()
        replacement = AgentProcess(prefill.cfg, tmp_path, "prefill-new")
        try:
            ports = replacement.wait_ready()
            ready_at = replacement.ready_path.stat().st_mtime

            def paired_with_new() -> bool:
                st = decode.status()
                return bool(st["prefill"]["0"]["instance"] == ports["instance"] != old
                            and st["prefill"]["0"]["state"] == "paired")

            wait_for("decode paired with the new prefill",
                     paired_with_new, timeout=HEARTBEAT * MISSES + 5, interval=0.05)
            since = peer_entry(decode)["since"]
            assert since >= stopped_at, "decode's pairing is from before the swap"
            took = since - ready_at  # < 0: paired while the new prefill was still writing its ready file
            before = decode.status()["requests"]["succeeded"]
            wait_for("rooms flowing again",
                     lambda: decode.status()["requests"]["succeeded"] >= before + 3, timeout=30)
            fault_row.observed = f"paired {took:.2f} s after the new prefill was ready"
            assert took <= HEARTBEAT, fault_row.observed
            assert decode.status()["requests"]["verification_failures"] == 0
        finally:
            replacement.stop()


FLOOD_SECONDS = 8.0


def flood(port: int, seconds: float, size: int, count: int) -> int:
    """A stranger pushes ``count`` junk messages of ``size`` bytes at ``port`` for at most ``seconds``;
    returns how many it sent."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 10000)
    sock.connect(f"tcp://127.0.0.1:{port}")
    junk, sent, end = zmq.Frame(bytes(size)), 0, time.monotonic() + seconds
    try:
        while sent < count and time.monotonic() < end:
            try:
                sock.send(junk, zmq.NOBLOCK, copy=False)
                sent += 1
            except zmq.Again:
                time.sleep(0.001)
    finally:
        sock.close()
        ctx.destroy(linger=0)
    return sent


@pytest.mark.parametrize(("size", "count"), [(1024, 10_000_000), (60 << 20, 16)], ids=["1KiB", "60MB"])
def test_flooded_prefill_keeps_or_restores_pairing(
    tmp_path: Path, fault_row: FaultRow, size: int, count: int
) -> None:
    """A stranger floods prefill's control socket under load (junk at full speed for 8 s, or sixteen
    60 MB messages): prefill answers it nothing, and the pairing holds or is restored within heartbeat x
    misses + 1 s of the flood's end, with rooms flowing again. The worker serves its sources fairly, so
    neither side loses the other's heartbeats meanwhile."""
    what = f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MB"
    fault_row.fault = f"prefill's control socket flooded ({what} messages)"
    fault_row.injected = f"a stranger's ZMQ PUSH: ≤ {count} junk messages of {what} in {FLOOD_SECONDS:g} s"
    fault_row.bound = f"pairing kept; rooms flowing ≤ {DETECT_BOUND:.0f} s after the flood ends"
    with pair(tmp_path, config(0, rps=20, tokens=(700,))) as (prefill, decode):
        wait_for("first rooms", lambda: decode.status()["requests"]["succeeded"] >= 3, timeout=30)
        sent = flood(prefill.ports["control_port"], FLOOD_SECONDS, size, count)
        ended = time.monotonic()
        before = decode.status()["requests"]["succeeded"]

        def flowing() -> bool:
            st = decode.status()
            return bool(st["prefill"]["0"]["state"] == "paired" and st["requests"]["succeeded"] >= before + 3)

        wait_for("pairing and rooms after the flood", flowing, timeout=DETECT_BOUND + 10, interval=0.05)
        took = time.monotonic() - ended
        lost = sum(1 for agent in (prefill, decode) for f in agent.status()["rooms"]["recent_failures"]
                   if "heartbeat lost" in f["reason"])
        control = prefill.status()["control"]
        dropped = sum(control["rejected"].values())
        fault_row.observed = (
            f"{sent} junk messages sent, {dropped} read and dropped by prefill; rooms flowing {took:.2f} s "
            f"after the flood; {lost} room(s) failed by heartbeat loss"
        )
        assert took <= DETECT_BOUND, fault_row.observed
        assert lost == 0, fault_row.observed  # a fair worker kept reading its peer's beats throughout
        assert healthy(prefill) and healthy(decode)


ABORTS = 1000
ABORT_BOUND = 2.0


def test_a_thousand_aborts_at_once_leave_no_room_running(tmp_path: Path, fault_row: FaultRow) -> None:
    """The test is decode's engine (sidecar mode): it asks for 1,000 rooms that wait at prefill (its
    engine frozen), then aborts them all at once. 2 s later neither agent runs a room, and the engine
    has every room reported failed."""
    fault_row.fault = f"{ABORTS} aborts at once"
    fault_row.injected = f"decode's engine aborts {ABORTS} waiting rooms back to back (local API)"
    fault_row.bound = f"no running room on either agent {ABORT_BOUND:g} s later"
    pair = SidecarPair(config(0, tokens=(700,)), tmp_path)
    dcfg = pair.cfg["decode"]
    schema = schema_from_config(dcfg)
    shared = SharedPools([(r.name, r.component, r.tensor, r.size) for r in schema.regions()])
    client = AgentClient(dcfg.localapi.engine.socket_path, role="decode",
                         manifest=encode_manifest(manifest_from_schema(schema, role="decode")))
    try:
        prefill, decode = pair.start_agent("prefill"), pair.start_agent("decode")
        engine = pair.start_engine("prefill")
        wait_for("decode agent socket", lambda: try_register(client, shared), timeout=30)
        prefill.wait_ready()
        decode.wait_ready()
        wait_for("decode paired", lambda: decode.status()["ready"], timeout=30)
        engine.proc.send_signal(signal.SIGSTOP)
        rooms = range(1 << 40, (1 << 40) + ABORTS)
        kv = np.array([0], np.int32)
        for room in rooms:
            client.expect(room, kv, 0)
        wait_for(f"{ABORTS} rooms waiting at prefill",
                 lambda: prefill.status()["rooms"]["inflight"] == ABORTS, timeout=30)
        started = time.monotonic()
        for room in rooms:
            client.abort(room, "fault matrix")
        sent = time.monotonic() - started

        def running() -> dict[str, int]:
            return {a.tag.split("-")[0]: a.status()["rooms"]["inflight"] for a in (decode, prefill)}

        while time.monotonic() - started < ABORT_BOUND and any(running().values()):
            time.sleep(0.05)
        drained = time.monotonic() - started
        time.sleep(max(0.0, ABORT_BOUND - (time.monotonic() - started)))
        left = running()
        states = Counter(state for state, _ in client.poll_many(list(rooms)))
        fault_row.observed = (
            f"aborts sent in {sent * 1000:.0f} ms, no room running after {drained:.2f} s; at "
            f"{ABORT_BOUND:g} s: decode {left['decode']}, prefill {left['prefill']} running; engine saw "
            f"{states[0]} failed"
        )
        assert left == {"decode": 0, "prefill": 0}, fault_row.observed
        assert states == Counter({0: ABORTS}), states  # KVPoll.Failed, every room
        assert Counter(prefill.status()["rooms"]["finished"])["aborted"] == ABORTS
        engine.proc.send_signal(signal.SIGCONT)
        assert healthy(prefill) and healthy(decode)
    finally:
        client.close()
        pair.stop()
        shared.close()


def try_register(client: AgentClient, shared: SharedPools) -> bool:
    try:
        client.connect()
        client.register_pools(shared.regions, shared.fds)
        return True
    except ConnectionError:
        return False
