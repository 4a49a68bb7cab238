"""The MoRI path end to end, in one process: a prefill and a decode ``AgentRuntime`` with
``backend: mori``, their transports built on ``dataplane.transports.mori_double`` — the MoRI hardware
TEST DOUBLE, passed through the runtime's ``transport_sdk`` hook (no monkeypatching) — pair over real
loopback HTTP/ZMQ, move a hybrid profile's KV, aux and mamba state, and decode verifies every byte."""

from __future__ import annotations

from dataplane.agent import AgentRuntime
from dataplane.config import AgentConfig, ModelConfig, SyntheticConfig, TransferConfig
from dataplane.harness.agent_processes import loopback_pair
from dataplane.transports import mori_double
from dataplane.transports.mori import MoriTransport
from tests.inprocess import verified_run

REQUESTS = 6


def mori_config() -> AgentConfig:
    return AgentConfig(
        model=ModelConfig(profile="qwen3-next", pool_pages=64, max_requests=4),
        transfer=TransferConfig(backend="mori", timeout_seconds=5, heartbeat_interval_seconds=0.2),
        synthetic=SyntheticConfig(
            requests_per_second=0, requests=REQUESTS, tokens=(700, 2048, 64), max_inflight=2, verify=True
        ),
    )


def test_hybrid_profile_moves_and_verifies_through_the_mori_double():
    (p_cfg,), (d_cfg,) = loopback_pair(mori_config())
    prefill = AgentRuntime(p_cfg, transport_sdk=mori_double).start()
    decode = AgentRuntime(d_cfg, transport_sdk=mori_double).start()
    try:
        assert isinstance(prefill.transport, MoriTransport) and isinstance(decode.transport, MoriTransport)
        comps = verified_run(decode, REQUESTS, timeout=30)["components"]
        assert {"kv", "aux", "mamba"} <= set(comps), comps
        engine = mori_double.engine(prefill.agent_id)
        assert engine.batch_calls, "prefill's writes went through the double's batch_write"
        assert prefill.status.ready and decode.status.ready
    finally:
        decode.stop()
        prefill.stop()
