"""Two (or three) real agent processes on loopback moving real bytes over NIXL, verified on decode.

Every test starts ``pdpair-agent run`` processes through ``dataplane.harness.agent_processes`` and reads their
``/status`` and ``/metrics`` endpoints — the same surfaces an operator or Prometheus sees.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from dataplane.config import (
    AgentConfig,
    ComponentConfig,
    IdentityConfig,
    ListenConfig,
    ModelConfig,
    NixlConfig,
    SyntheticConfig,
    TransferConfig,
)
from dataplane.harness.agent_processes import AgentProcess, loopback_pair
from dataplane.harness.waiting import wait_for

pytestmark = [pytest.mark.nixl, pytest.mark.slow]

HB = 0.5


def config(
    profile="qwen3-next", requests=12, tokens=(700, 0, 2048), pool_pages=128, max_requests=8, **model
) -> AgentConfig:
    return AgentConfig(
        model=ModelConfig(profile=profile, pool_pages=pool_pages, max_requests=max_requests, **model),
        transfer=TransferConfig(timeout_seconds=5, heartbeat_interval_seconds=HB, heartbeat_misses=6),
        synthetic=SyntheticConfig(requests_per_second=0, requests=requests, tokens=tokens, max_inflight=3),
    )


@contextmanager
def agents(tmp_path, base, prefill_tp=1, decode_tp=1, decode_base=None):
    pcfgs, dcfgs = loopback_pair(base, prefill_tp=prefill_tp, decode_tp=decode_tp)
    if decode_base is not None:  # another config for decode, the same PDPair (pairing key)
        _, dcfgs = loopback_pair(
            msgspec.structs.replace(decode_base, auth=pcfgs[0].auth),
            prefill_tp=prefill_tp,
            decode_tp=decode_tp,
            bootstrap_port=pcfgs[0].listen.bootstrap_port,
        )
    # One process per rank (``--tp-rank``): each rank's status, metrics and signals on their own.
    procs = [AgentProcess(c, tmp_path, f"prefill-{c.tp_rank}", one_rank=True) for c in pcfgs]
    procs += [AgentProcess(c, tmp_path, f"decode-{c.tp_rank}", one_rank=True) for c in dcfgs]
    try:
        for p in procs:
            p.wait_ready()
        yield procs[:prefill_tp], procs[prefill_tp:]
    finally:
        for p in reversed(procs):
            p.stop()



def finished(decode, n):
    return all(d.status()["requests"]["completed"] >= n for d in decode)


def assert_all_verified(decode, n, components):
    for d in decode:
        st = d.status()
        assert st["requests"]["succeeded"] == n, (st["requests"], d.log_tail())
        assert st["requests"]["verification_failures"] == 0
        seen = st["components"]
        assert set(components) <= set(seen), seen
        for name, c in seen.items():
            assert c["bytes"] > 0 and c["verified_bytes"] == c["bytes"] and c["mismatched_bytes"] == 0, name


@pytest.mark.parametrize(
    ("profile", "components"),
    [
        ("qwen3-next", {"kv", "aux", "mamba"}),
        ("deepseek-v3.2", {"kv", "aux", "dsa"}),
        ("gpt-oss", {"kv", "aux", "swa"}),
        ("minimax-m2", {"kv", "aux", "dense_kv"}),
    ],
)
def test_profile_moves_and_verifies_every_component(tmp_path, profile, components):
    with agents(tmp_path, config(profile)) as (prefill, decode):
        wait_for("12 requests", lambda: finished(decode, 12), timeout=90)
        assert_all_verified(decode, 12, components)
        metrics = urllib.request.urlopen(decode[0].url + "/metrics", timeout=2).read().decode()
        assert 'pdpair_agent_verified_bytes_total{component="kv"' in metrics
        (prefill_address,) = decode[0].status()["lanes"]["up"]  # the control frames took the direct lane
        assert prefill_address == f"tcp://127.0.0.1:{prefill[0].ports['control_port']}"
        assert len(prefill[0].status()["lanes"]["up"]) == 1


def test_spinning_workers_move_and_verify(tmp_path):
    base = config(requests=30, tokens=(16, 700))
    spinning = msgspec.structs.replace(base.transfer, spin_microseconds=300)
    with agents(tmp_path, msgspec.structs.replace(base, transfer=spinning)) as (prefill, decode):
        wait_for("30 requests", lambda: finished(decode, 30), timeout=90)
        assert_all_verified(decode, 30, {"kv", "aux", "mamba"})
        assert len(decode[0].status()["lanes"]["up"]) == 1
        slack = Path(f"/proc/{prefill[0].proc.pid}/timerslack_ns")
        if slack.exists():  # Linux: `run` tightens the timers of the process before any thread starts
            assert slack.read_text().strip() == "1"


@pytest.mark.parametrize(("prefill_lanes", "decode_lanes"), [(False, False), (True, False), (False, True)])
def test_control_stays_on_zmq_unless_both_sides_have_lanes(tmp_path, prefill_lanes, decode_lanes):
    def with_lanes(cfg, on):
        return msgspec.structs.replace(cfg, listen=ListenConfig(lanes=on))

    base = config(requests=6)
    with agents(tmp_path, with_lanes(base, prefill_lanes), decode_base=with_lanes(base, decode_lanes)) as (
        prefill,
        decode,
    ):
        wait_for("6 requests over ZMQ", lambda: finished(decode, 6), timeout=90)
        assert_all_verified(decode, 6, {"kv", "aux", "mamba"})
        for agent in (*prefill, *decode):
            assert agent.status().get("lanes", {"up": []})["up"] == []


def test_positional_state_types(tmp_path):
    types = ["swa_ring", "c128_state", "qsa_pending", "qsa_compressed", "minimax_index_k"]
    comps = [ComponentConfig(name=t, state_type=t, item_lens=[1024, 512], num_items=128) for t in types]
    base = config(profile=None, kv_item_len=4096, kv_layers=2, components=comps)
    with agents(tmp_path, base) as (_, decode):
        wait_for("12 requests", lambda: finished(decode, 12), timeout=90)
        assert_all_verified(decode, 12, {"kv", *types})


@pytest.mark.parametrize(("ptp", "dtp"), [(1, 2), (2, 1)])
def test_tp_mismatched_mamba(tmp_path, ptp, dtp):
    # Two decode ranks finish their parts of a room independently, so prefill can hold parts of more
    # rooms than one rank keeps in flight: its pools are sized for that skew, not for three rooms.
    base = config(requests=8, pool_pages=512, max_requests=32)
    with agents(tmp_path, base, prefill_tp=ptp, decode_tp=dtp) as (_, decode):
        wait_for("8 requests per decode rank", lambda: finished(decode, 8), timeout=60)
        assert_all_verified(decode, 8, {"kv", "mamba"})


def test_all_empty_requests_complete(tmp_path):
    with agents(tmp_path, config(requests=5, tokens=(0,))) as (_, decode):
        wait_for("5 empty requests", lambda: finished(decode, 5), timeout=90)
        st = decode[0].status()
        assert st["requests"]["succeeded"] == 5 and st["components"] == {}


def test_schema_mismatch_refused_on_both_sides(tmp_path):
    other = config(dtype="float16")
    with agents(tmp_path, config(), decode_base=other) as (prefill, decode):
        wait_for("refusal on decode", lambda: decode[0].status()["refusals"]["recent"], timeout=90)
        d, p = decode[0].status(), prefill[0].status()
        assert "kv dtype bfloat16 on prefill vs float16 on decode" in d["refusals"]["recent"][0]["reason"]
        assert d["refusals"]["recent"][0]["refused_by"] == "peer"
        assert "kv dtype bfloat16" in p["refusals"]["recent"][0]["reason"]
        assert not p["ready"] and not d["ready"]
        for agent in (prefill[0], decode[0]):
            text = urllib.request.urlopen(agent.url + "/metrics", timeout=2).read().decode()
            assert 'reason="kv_mismatch"' in text


def test_generation_mismatch_refused(tmp_path):
    base = msgspec.structs.replace(config(), identity=IdentityConfig(generation="g1"))
    other = msgspec.structs.replace(config(), identity=IdentityConfig(generation="g2"))
    with agents(tmp_path, base, decode_base=other) as (_, decode):
        wait_for("refusal", lambda: decode[0].status()["refusals"]["recent"], timeout=90)
        assert "generation g1 ≠ decode generation g2" in decode[0].status()["refusals"]["recent"][0]["reason"]


def test_dead_prefill_fails_rooms_by_heartbeat(tmp_path):
    slow = msgspec.structs.replace(
        config(requests=0),
        synthetic=SyntheticConfig(requests_per_second=5, requests=0, tokens=(700,), max_inflight=2),
    )
    with agents(tmp_path, slow) as (prefill, decode):
        wait_for("some requests", lambda: decode[0].status()["requests"]["succeeded"] >= 2, timeout=90)
        prefill[0].signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for("peer down", lambda: decode[0].status()["prefill"]["0"]["state"] == "down", timeout=10)
        assert time.monotonic() - killed < HB * 6 + 2.5
        st = decode[0].status()
        assert st["rooms"]["inflight"] == 0 and not st["ready"]
        assert "heartbeat lost" in next(iter(st["peers"].values()))["reason"]


def test_dead_decode_marked_down_by_heartbeat(tmp_path):
    slow = msgspec.structs.replace(
        config(requests=0),
        synthetic=SyntheticConfig(requests_per_second=5, requests=0, tokens=(700,), max_inflight=2),
    )
    with agents(tmp_path, slow) as (prefill, decode):
        wait_for("some requests", lambda: decode[0].status()["requests"]["succeeded"] >= 2, timeout=90)
        assert prefill[0].status()["ready"]
        decode[0].signal(signal.SIGKILL)
        killed = time.monotonic()

        def down():
            peers = prefill[0].status()["peers"]
            return peers and all(p["state"] == "down" for p in peers.values())

        wait_for("decode down on prefill", down, timeout=10)
        assert time.monotonic() - killed < HB * 6 + 2.5
        st = prefill[0].status()
        assert st["rooms"]["inflight"] == 0 and not st["ready"]
        assert "heartbeat lost" in next(iter(st["peers"].values()))["reason"]
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(prefill[0].url + "/readyz", timeout=2)
        assert err.value.code == 503
        text = urllib.request.urlopen(prefill[0].url + "/metrics", timeout=2).read().decode()
        assert 'pdpair_agent_peer_up{peer="decode-0@127.0.0.1",role="prefill",tp_rank="0"} 0.0' in text


def test_prefill_replaced_behind_bootstrap_rehandshakes(tmp_path):
    slow = msgspec.structs.replace(
        config(requests=0),
        synthetic=SyntheticConfig(requests_per_second=10, requests=0, tokens=(700,), max_inflight=2),
    )
    with agents(tmp_path, slow) as (prefill, decode):
        wait_for("first requests", lambda: decode[0].status()["requests"]["succeeded"] >= 2, timeout=90)
        old = decode[0].status()["prefill"]["0"]["instance"]
        prefill[0].stop()
        replacement = AgentProcess(prefill[0].cfg, tmp_path, "prefill-0-new")
        try:
            replacement.wait_ready()
            wait_for("new instance",
                     lambda: decode[0].status()["prefill"]["0"]["instance"] != old, timeout=90)
            before = decode[0].status()["requests"]["succeeded"]
            wait_for("requests resume",
                     lambda: decode[0].status()["requests"]["succeeded"] >= before + 3, timeout=90)
            assert decode[0].status()["prefill"]["0"]["state"] == "paired"
            assert decode[0].status()["requests"]["verification_failures"] == 0
        finally:
            replacement.stop()


def test_deadline_frees_prefill_worker_when_decode_freezes(tmp_path):
    """A decode frozen mid-room (SIGSTOP: its UCX progress stops, so prefill's writes cannot complete)
    costs prefill the deadline and nothing more: the stuck rooms fail with the deadline's reason within
    the deadline + 10%, the worker stays healthy, and it serves new rooms once decode runs again."""
    timeout = 1.5
    tcp = msgspec.structs.replace(
        config(requests=0),
        transfer=TransferConfig(
            timeout_seconds=timeout,
            heartbeat_interval_seconds=HB,
            nixl=NixlConfig(ucx_tls="tcp", ucx_net_devices="lo"),
        ),
        synthetic=SyntheticConfig(requests_per_second=0, requests=0, tokens=(4096,), max_inflight=3),
    )
    with agents(tmp_path, tcp) as (prefill, decode):
        wait_for("first requests", lambda: decode[0].status()["requests"]["succeeded"] >= 2, timeout=90)
        for _ in range(5):  # freeze decode at a moment prefill holds a room (nearly always the first)
            decode[0].signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            stuck = prefill[0].status()["rooms"]
            if stuck["inflight"]:
                break
            decode[0].signal(signal.SIGCONT)
            time.sleep(0.05)
        else:
            pytest.fail("prefill never held a room when decode froze")
        try:
            wait_for("prefill rooms freed",
                     lambda: prefill[0].status()["rooms"]["inflight"] == 0, timeout=timeout * 1.1 + 2)
            freed_after = time.monotonic() - frozen_at
            rooms = prefill[0].status()["rooms"]
            expired = [f for f in rooms["recent_failures"] if f["reason"].startswith("deadline exceeded")]
            assert len(expired) >= stuck["inflight"], rooms
            assert all(f["after_seconds"] <= timeout * 1.1 for f in expired), expired
            # the rooms were at most ``timeout`` old when freed; 0.25 s for the status polls around it
            assert freed_after <= timeout * 1.1 + 0.25, (freed_after, rooms)
            text = urllib.request.urlopen(prefill[0].url + "/healthz", timeout=2).read()
            assert b"true" in text
        finally:
            decode[0].signal(signal.SIGCONT)
        served = prefill[0].status()["rooms"]["finished"].get("success", 0)
        wait_for("new rooms served after decode resumed",
                 lambda: prefill[0].status()["rooms"]["finished"].get("success", 0) >= served + 3, timeout=30)
