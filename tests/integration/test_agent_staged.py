"""The staged path inside the real agents: two (or three) ``pdpair-agent run`` processes over NIXL on
loopback, host-memory pools (``transfer.staged.mode: on``), every byte verified by decode.

Slots are few and small, so every request is cut into more pieces than there are slots: back-pressure
and slot reuse happen in every room. A decode killed or frozen mid-stream must fail prefill's rooms
and give every staging slot back.
"""

from __future__ import annotations

import re
import signal
import time
import urllib.request

import msgspec
import pytest

from dataplane.config import AgentConfig, StagedConfig, SyntheticConfig
from dataplane.harness.waiting import wait_for
from tests.integration.test_agent_two_process import (
    HB,
    agents,
    assert_all_verified,
    config,
    finished,
)

pytestmark = [pytest.mark.nixl, pytest.mark.slow]

SLOTS, SLOT_BYTES = 2, 64 << 10


def staged(base: AgentConfig, threshold: int = 512 << 10, **transfer) -> AgentConfig:  # type: ignore[no-untyped-def]
    tr = msgspec.structs.replace(
        base.transfer,
        staged=StagedConfig(
            mode="on", threshold_bytes=threshold, min_writes=1, slot_bytes=SLOT_BYTES, slots=SLOTS
        ),
        **transfer,
    )
    # Rooms wait for slots, so more of them hold prefill's pages at once than on the direct path.
    model = msgspec.structs.replace(base.model, pool_pages=512)
    return msgspec.structs.replace(base, transfer=tr, model=model)


def staged_bytes(agent) -> dict[str, float]:  # type: ignore[no-untyped-def]
    text = urllib.request.urlopen(agent.url + "/metrics", timeout=2).read().decode()
    pattern = r'pdpair_agent_staged_bytes_total\{component="(\w+)"[^}]*\} (\S+)'
    return {c: float(v) for c, v in re.findall(pattern, text)}


@pytest.mark.parametrize(
    ("profile", "components", "threshold", "want_staged"),
    [
        ("qwen3-next", {"kv", "aux", "mamba"}, 8 << 20, {"kv", "aux", "mamba"}),
        # DSA index keys (132 B per token) are staged, MLA KV (1,152 B per token) written directly: a
        # room's page runs (11 or 32 pages) make KV writes of 792 KB or more, DSA writes 270 KB at most.
        ("deepseek-v3.2", {"kv", "aux", "dsa"}, 512 << 10, {"aux", "dsa"}),
        ("deepseek-v3.2", {"kv", "aux", "dsa"}, 1 << 40, {"kv", "aux", "dsa"}),
    ],
)
def test_staged_rooms_deliver_every_byte(tmp_path, profile, components, threshold, want_staged):
    with agents(tmp_path, staged(config(profile), threshold)) as (prefill, decode):
        wait_for("12 requests", lambda: finished(decode, 12), timeout=90)
        assert_all_verified(decode, 12, components)
        moved = staged_bytes(prefill[0])
        assert {c for c, v in moved.items() if v > 0} == want_staged, moved
        st = prefill[0].status()["staged"]
        assert st["slots_free"] == SLOTS and st["peers"], st
        assert decode[0].status()["staged"]["scattering"] == 0


@pytest.mark.parametrize(("ptp", "dtp"), [(1, 2), (2, 1)])
def test_staged_with_tp_mismatch(tmp_path, ptp, dtp):
    """Decode pulling from two prefill ranks gives each its own landing slots (no shared slot)."""
    with agents(tmp_path, staged(config(requests=8)), prefill_tp=ptp, decode_tp=dtp) as (prefill, decode):
        wait_for("8 requests per decode rank", lambda: finished(decode, 8), timeout=60)
        assert_all_verified(decode, 8, {"kv", "mamba"})
        assert all(staged_bytes(p).get("kv", 0) > 0 for p in prefill)
        assert all(len(d.status()["staged"]["landing_sets"]) == max(1, ptp // dtp) for d in decode)


def test_staged_off_writes_directly(tmp_path):
    base = msgspec.structs.replace(
        config(requests=6),
        transfer=msgspec.structs.replace(config().transfer, staged=StagedConfig(mode="off")),
    )
    with agents(tmp_path, base) as (prefill, decode):
        wait_for("6 requests", lambda: finished(decode, 6), timeout=90)
        assert_all_verified(decode, 6, {"kv", "mamba"})
        assert staged_bytes(prefill[0]) == {} and "staged" not in prefill[0].status()


def test_only_prefill_staged_falls_back_to_direct(tmp_path):
    """A decode that offers no landing buffer (like a plain sglang decode) gets direct writes."""
    off = msgspec.structs.replace(
        config(requests=6),
        transfer=msgspec.structs.replace(config().transfer, staged=StagedConfig(mode="off")),
    )
    with agents(tmp_path, staged(config(requests=6)), decode_base=off) as (prefill, decode):
        wait_for("6 requests", lambda: finished(decode, 6), timeout=90)
        assert_all_verified(decode, 6, {"kv", "mamba"})
        assert staged_bytes(prefill[0]) == {} and prefill[0].status()["staged"]["peers"] == []


@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_lost_decode_mid_staged_rooms_frees_every_slot(tmp_path, how):
    stream = msgspec.structs.replace(
        staged(config(requests=0), timeout_seconds=1.5),
        synthetic=SyntheticConfig(requests_per_second=20, requests=0, tokens=(4096,), max_inflight=3),
    )
    with agents(tmp_path, stream) as (prefill, decode):
        wait_for("first requests", lambda: decode[0].status()["requests"]["succeeded"] >= 2, timeout=90)
        decode[0].signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        try:
            lost = time.monotonic()

            def dropped() -> bool:
                """Rooms failed, slots free and the decode forgotten: the rooms' deadline (1.5 s) may
                free the slots before the heartbeat loss drops the peer, so wait for both."""
                st = prefill[0].status()
                return (
                    st["rooms"]["inflight"] == 0
                    and st["staged"]["slots_free"] == SLOTS
                    and st["staged"]["peers"] == []
                )

            wait_for("prefill rooms failed, slots free, decode dropped", dropped, timeout=HB * 6 + 5)
            assert time.monotonic() - lost < HB * 6 + 5
            assert prefill[0].status()["staged"]["pieces_waiting"] == 0
            assert b"true" in urllib.request.urlopen(prefill[0].url + "/healthz", timeout=2).read()
        finally:
            if how == "freeze":
                decode[0].signal(signal.SIGCONT)


def test_staged_rooms_on_cuda(tmp_path):
    """The same agents with their pools and staging buffers in GPU memory (``mode: auto`` stages
    there): gather and scatter kernels on the device, NIXL VRAM writes, every byte verified."""
    torch = pytest.importorskip("torch", reason="needs a CUDA GPU")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    base = staged(config("qwen3-next"))
    gpu = msgspec.structs.replace(
        base.transfer, device="cuda", staged=msgspec.structs.replace(base.transfer.staged, mode="auto")
    )
    with agents(tmp_path, msgspec.structs.replace(base, transfer=gpu)) as (prefill, decode):
        wait_for("12 requests", lambda: finished(decode, 12), timeout=90)
        assert_all_verified(decode, 12, {"kv", "aux", "mamba"})
        assert staged_bytes(prefill[0]).get("kv", 0) > 0
        assert prefill[0].status()["staged"]["slots_free"] == SLOTS
