"""Warm-up rooms (``synthetic.warmup``) finish before the first counted room starts, on decode's agent
and on the sidecar's synthetic engine: a benchmark's raw baseline finishes its warm-up requests before
its clock starts, so a warm-up room still moving bytes inside the counted window would make the agent
look slower than it is (it did: 16-64 MiB blocks with 8 rooms in flight read 0.74-0.76x, 0.94-0.95x
once fixed, docs/benchmarks.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from dataplane.agent import AgentRuntime
from dataplane.agent.decode import DecodeWorker
from dataplane.agent.sources import SyntheticDecodeSource
from dataplane.config import AgentConfig, ModelConfig, SyntheticConfig, TransferConfig
from dataplane.harness.agent_processes import loopback_pair
from dataplane.synthetic_engine.process import SyntheticEngineProcess
from dataplane.transports import mori_double

WARMUP, INFLIGHT, REQUESTS = 3, 3, 9


def config() -> AgentConfig:
    return AgentConfig(
        model=ModelConfig(profile="qwen3-next", pool_pages=64, max_requests=8),
        transfer=TransferConfig(backend="mori", timeout_seconds=5, heartbeat_interval_seconds=0.2),
        synthetic=SyntheticConfig(
            requests_per_second=0, requests=REQUESTS, tokens=(700, 64), max_inflight=INFLIGHT,
            warmup=WARMUP, verify=True,
        ),
    )


class RecordingSource(SyntheticDecodeSource):
    """Decode's own synthetic rooms, noting how many rooms were in flight as each room started."""

    def __init__(self) -> None:
        super().__init__()
        self.live_at_start: list[int] = []

    def new_room(self, tokens: int) -> bool:
        live = len(self.worker.rooms)
        started = super().new_room(tokens)
        if started:
            self.live_at_start.append(live)
        return started


def recording_decode(*args: Any, **kwargs: Any) -> DecodeWorker:
    return DecodeWorker(*args, source=RecordingSource(), **kwargs)


def test_decode_starts_counted_rooms_only_after_every_warmup_room_finished() -> None:
    (p_cfg,), (d_cfg,) = loopback_pair(config())
    prefill = AgentRuntime(p_cfg, transport_sdk=mori_double).start()
    decode = AgentRuntime(d_cfg, transport_sdk=mori_double, worker_factory=recording_decode).start()
    try:
        deadline = time.monotonic() + 30
        while decode.worker.completed < REQUESTS and time.monotonic() < deadline:
            time.sleep(0.02)
        worker: Any = decode.worker
        assert decode.status.snapshot()["requests"]["succeeded"] == REQUESTS
        live = worker.source.live_at_start
        assert len(live) == REQUESTS
        assert live[WARMUP] == 0, live  # the first counted room waited for the warm-up rooms
        assert max(live[:WARMUP]) > 0 and max(live[WARMUP:]) > 0, live  # both phases ran rooms in parallel
    finally:
        decode.stop()
        prefill.stop()


def test_sidecar_engine_holds_counted_requests_while_warmup_ones_are_in_flight(tmp_path: Path) -> None:
    cfg = msgspec.structs.replace(config(), role="decode")
    engine = SyntheticEngineProcess(cfg, str(tmp_path / "agent.sock"))
    engine.made, engine.warm = WARMUP, {engine.room_base + WARMUP - 1}
    engine.inflight = {engine.room_base + WARMUP - 1: (engine.take(1, False, ()), 0.0)}  # type: ignore[dict-item]
    assert not engine.may_start(REQUESTS, INFLIGHT)
    engine.warm.clear()
    assert engine.may_start(REQUESTS, INFLIGHT)
    engine.made, engine.warm = 1, {engine.room_base}
    assert engine.may_start(REQUESTS, INFLIGHT)  # warm-up requests themselves overlap freely
