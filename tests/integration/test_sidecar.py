"""Sidecar mode end to end: per role, a synthetic engine process and an agent process sharing a Unix
socket; real bytes over NIXL between the agents, written into and read from memory the *engines*
allocated (shared memory passed by descriptor), verified per component by the decode engine.

Failure cases: an engine killed (its agent fails its rooms, tells the peer, unmaps, and serves the
engine's next incarnation), an agent killed (its engine gets clear errors, keeps running, and
re-registers when the agent is back).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from dataplane.agent.pools import MemoryPools
from dataplane.agent.synthetic import SyntheticEngine, items_for_tokens
from dataplane.codec import encode_manifest, manifest_from_schema
from dataplane.config import AgentConfig, ComponentConfig, ModelConfig, SyntheticConfig, TransferConfig
from dataplane.harness.sidecar_pair import SidecarPair
from dataplane.harness.waiting import wait_for
from dataplane.localapi import AgentClient, SharedPools
from dataplane.schema.profiles import schema_from_config

pytestmark = [pytest.mark.nixl, pytest.mark.slow]
LOST_BEATS = 16
"""Heartbeat misses before prefill drops a decode address, where a test needs the time (8 s) to
have rooms of the next decode engine in flight first."""


def config(
    profile="qwen3-next", requests=12, tokens=(700, 0, 2048), timeout=5.0, misses=4, **model
) -> AgentConfig:
    return AgentConfig(
        model=ModelConfig(profile=profile, pool_pages=128, max_requests=8, **model),
        transfer=TransferConfig(
            timeout_seconds=timeout, heartbeat_interval_seconds=0.5, heartbeat_misses=misses
        ),
        synthetic=SyntheticConfig(requests_per_second=0, requests=requests, tokens=tokens, max_inflight=3),
    )


def assert_verified(report, n, components):
    counts = report["counts"]
    why = f"counts {counts}; failed rooms {report.get('failures', {})}"  # a string: shown whole
    assert counts.get("verified") == n, why
    assert counts.get("failed", 0) == 0 and counts.get("verification_failures", 0) == 0, why
    assert counts.get("succeeded") == n, why
    assert set(report["components"]) == set(components), report["components"]
    for name, c in report["components"].items():
        assert c["bytes"] > 0 and c["bad"] == 0 and c["ok"] > 0, (name, c)


@pytest.mark.parametrize(
    ("profile", "components"),
    [
        ("qwen3-next", {"kv", "aux", "mamba"}),
        ("deepseek-v3.2", {"kv", "aux", "dsa"}),
        ("gpt-oss", {"kv", "aux", "swa"}),
        ("minimax-m2", {"kv", "aux", "dense_kv"}),
    ],
)
def test_every_profile_moves_engine_memory_verified_per_component(tmp_path, profile, components):
    with SidecarPair(config(profile), tmp_path) as pair:
        decode = pair.engines["decode"]
        assert decode.wait(60) == 0, decode.log_tail()
        assert_verified(decode.report(), 12, components)
        prefill = pair.engines["prefill"]
        wait_for("12 rooms sent by prefill", lambda: prefill.count("succeeded") == 12, timeout=5)


def test_agents_without_a_layout_adopt_their_engines_schema(tmp_path):
    """The agents' configs name no model (``model.profile: null``): each takes its engine's manifest
    and regions as its schema, and the two pair and move every component as with the profile."""
    with SidecarPair(config("qwen3-next"), tmp_path, engine_schema=True) as pair:
        assert pair.agent_cfg["decode"].model.profile is None
        decode = pair.engines["decode"]
        assert decode.wait(60) == 0, decode.log_tail()
        assert_verified(decode.report(), 12, {"kv", "aux", "mamba"})
        assert pair.agents["prefill"].status()["components"]


def test_polling_engines_and_agents_spinning_for_their_answers(tmp_path):
    """The setting of a busy engine: engines that poll without sleeping (``--poll-us``), agents that
    poll for the engine's next request after each room they finish (``replySpinMicroseconds``)."""
    cfg = config(requests=24, tokens=(700, 0, 2048)).with_engine(reply_spin_microseconds=300)
    poll = ["--poll-us", "500"]
    with SidecarPair(cfg, tmp_path, decode_args=poll, prefill_args=poll) as pair:
        assert all(c.localapi.engine.reply_spin_microseconds == 300 for c in pair.cfg.values())
        decode = pair.engines["decode"]
        assert decode.wait(60) == 0, decode.log_tail()
        assert_verified(decode.report(), 24, {"kv", "aux", "mamba"})


def test_positional_state_types(tmp_path):
    types = ["swa_ring", "c128_state", "qsa_pending", "qsa_compressed", "minimax_index_k"]
    comps = [ComponentConfig(name=t, state_type=t, item_lens=[1024, 512], num_items=128) for t in types]
    cfg = config(profile=None, kv_item_len=4096, kv_layers=2, components=comps)
    with SidecarPair(cfg, tmp_path) as pair:
        assert pair.engines["decode"].wait(60) == 0
        assert_verified(pair.engines["decode"].report(), 12, {"kv", "aux", *types})


def test_prefill_engine_may_send_before_decode_asks(tmp_path):
    """The test process is the prefill engine: it sends every room first; decode asks afterwards."""
    cfg = config(requests=6, tokens=(1000,), timeout=30)
    room_base = 7 << 40
    pair = SidecarPair(cfg, tmp_path, decode_args=["--room-base", str(room_base)])
    pair.start_agent("prefill")
    pair.start_agent("decode")
    pcfg = pair.cfg["prefill"]
    schema = schema_from_config(pcfg)
    shared = SharedPools([(r.name, r.component, r.tensor, r.size) for r in schema.regions()])
    client = AgentClient(pcfg.localapi.engine.socket_path, role="prefill",
                         manifest=encode_manifest(manifest_from_schema(schema, role="prefill")))
    try:
        wait_for("prefill agent socket", lambda: _try_register(client, shared))
        pair.agents["prefill"].wait_ready()
        synthetic = SyntheticEngine(MemoryPools.adopt(schema, shared.buffers))
        counts = items_for_tokens(schema, 1000)
        for i in range(6):
            kv = np.arange(i * counts.kv, (i + 1) * counts.kv, dtype=np.int32)
            state = [np.array([i], np.int32) if n else None for n in counts.state]
            synthetic.fill(room_base + i, kv, i, state)
            client.send(room_base + i, kv, i, state)
            assert client.poll(room_base + i)[0] in (1, 2)
        decode = pair.start_engine("decode")
        pair.agents["decode"].wait_ready()
        assert decode.wait(60) == 0, decode.log_tail()
        assert_verified(decode.report(), 6, {"kv", "aux", "mamba"})
        assert all(client.wait(room_base + i, 10) == (4, "") for i in range(6))
    finally:
        client.close()
        pair.stop()
        del synthetic
        shared.close()


def _try_register(client, shared):
    try:
        client.connect()
        client.register_pools(shared.regions, shared.fds)
        return True
    except ConnectionError:
        return False


def test_decode_engine_killed_fails_rooms_unmaps_and_serves_the_next_engine(tmp_path):
    """Rooms are held open by freezing the prefill engine; killing the decode engine then fails
    them at once on both agents (not by the 20 s deadline), and the decode agent unmaps.

    The next engine's agent pairs from a new control address under the same label, and the prefill
    agent drops the old address only when its heartbeats run out (``LOST_BEATS`` beats after the
    kill). The prefill engine is frozen again so that the next engine's rooms wait at prefill across
    that moment: the old address's loss must neither fail them nor unpair the new decode."""
    cfg = config(requests=0, tokens=(2048,), timeout=20, misses=LOST_BEATS)
    with SidecarPair(cfg, tmp_path, decode_args=["--inflight", "2"]) as pair:
        decode, prefill, agent = pair.engines["decode"], pair.engines["prefill"], pair.agents["decode"]
        prefill_agent = pair.agents["prefill"]
        wait_for("some verified rooms", lambda: decode.count("verified") >= 5)
        maps = Path(f"/proc/{agent.proc.pid}/maps")
        assert "memfd:pdpair-" in maps.read_text()
        prefill.proc.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        decode.kill()
        wait_for("decode agent failing its rooms",
                 lambda: "failed: engine disconnected" in agent.log_tail(60), timeout=3)
        told = "failed: aborted by decode: engine disconnected"
        wait_for("prefill agent told", lambda: told in prefill_agent.log_tail(60), timeout=3)
        prefill.proc.send_signal(signal.SIGCONT)
        wait_for("engine told", lambda: prefill.count("failed: aborted by decode") >= 1, timeout=5)
        wait_for("engine memory unmapped", lambda: "memfd:pdpair-" not in maps.read_text(), timeout=10)

        def old_address_lost():
            return "heartbeat lost" in prefill_agent.log_path.read_text()

        prefill.proc.send_signal(signal.SIGSTOP)
        again = pair.start_engine("decode", ["--requests", "6"])
        wait_for("the next engine's rooms waiting at prefill",
                 lambda: prefill_agent.status()["rooms"]["inflight"] >= 1, timeout=10)
        assert not old_address_lost(), "the old decode address was lost before the next engine's rooms came"
        wait_for("prefill dropping the killed engine's decode address",
                 old_address_lost, timeout=LOST_BEATS * cfg.transfer.heartbeat_interval_seconds + 5)
        status = prefill_agent.status()
        rooms = status["rooms"]
        assert rooms["inflight"] >= 1, f"the next engine's rooms failed with the old address: {rooms}"
        assert status["ready"], f"the old address's loss unpaired the next engine's decode: {status['peers']}"
        prefill.proc.send_signal(signal.SIGCONT)
        assert again.wait(60) == 0, again.log_tail()
        assert_verified(again.report(), 6, {"kv", "aux", "mamba"})


def test_prefill_engine_killed_fails_decode_rooms_with_the_reason(tmp_path):
    cfg = config(requests=0, tokens=(2048,), timeout=20)
    with SidecarPair(cfg, tmp_path) as pair:
        decode = pair.engines["decode"]
        wait_for("some verified rooms", lambda: decode.count("verified") >= 5)
        pair.engines["prefill"].kill()
        wait_for("decode rooms failed",
                 lambda: decode.count("failed") >= 1 or decode.report().get("inflight") == 0, timeout=10)
        pair.start_engine("prefill")
        before = decode.count("verified")
        wait_for("rooms verified again", lambda: decode.count("verified") >= before + 5, timeout=30)
        assert decode.count("verification_failures") == 0


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_agent_killed_engine_gets_clear_errors_and_reregisters(tmp_path, role):
    cfg = config(requests=0, tokens=(2048,), timeout=10)
    with SidecarPair(cfg, tmp_path) as pair:
        decode, engine = pair.engines["decode"], pair.engines[role]
        wait_for("some verified rooms", lambda: decode.count("verified") >= 5)
        pair.agents[role].signal(signal.SIGKILL)
        pair.agents[role].stop()
        wait_for("engine sees the agent gone",
                 lambda: "unavailable" in engine.report().get("last_error", ""), timeout=10)
        assert engine.proc.poll() is None, "the engine keeps running without its agent"
        if role == "decode":
            wait_for("clear errors", lambda: decode.count("unavailable_calls") >= 1)
        before = decode.count("verified")
        pair.start_agent(role).wait_ready(30)
        wait_for("rooms verified again", lambda: decode.count("verified") >= before + 5, timeout=40)
        # The engine's report file is rewritten every 0.5 s: wait for it rather than read it once.
        wait_for("the client reconnected and re-registered its pools",
                 lambda: engine.report()["connections"] >= 2, timeout=5)
        assert decode.count("verification_failures") == 0


def test_pools_registered_again_on_one_connection_keep_the_engines_room_states(tmp_path):
    """A second ``RegisterPools`` on the same connection restarts the agent's runtime; the room states
    of the next runtime still reach the engine over that connection."""
    cfg = config(requests=0)
    pair = SidecarPair(cfg, tmp_path)
    try:
        pair.start_agent("decode")
        sock = Path(pair.cfg["decode"].localapi.engine.socket_path)
        wait_for("decode socket", sock.exists, timeout=60)
        schema = schema_from_config(pair.cfg["decode"])
        manifest = encode_manifest(manifest_from_schema(schema, role="decode"))
        with SharedPools([(r.name, r.component, r.tensor, r.size) for r in schema.regions()]) as pools, \
                AgentClient(str(sock), role="decode", manifest=manifest, timeout=10.0) as engine:
            engine.register_pools(pools.regions, pools.fds)
            engine.register_pools(pools.regions, pools.fds)  # the same connection: a new runtime
            engine.expect(5, [1], None, [[] for _ in schema.components])
            engine.abort(5, "cancelled by the test", ack=True)
            state, reason = engine.wait(5, timeout=20)
            assert state == 0 and "cancelled by the test" in reason, (state, reason)
    finally:
        pair.stop()
