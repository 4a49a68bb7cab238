"""One agent per pod serves every TP rank of it: real agent processes, real NIXL on loopback.

Sidecar pods run one synthetic engine process per rank (``pdpair-agent engine --tp-rank R``), all
connected to their pod's one agent socket; decode engines verify every byte per component. Cases:
prefill TP 2 → decode TP 1 and TP 1 → TP 2 with the qwen3-next profile (mamba state sliced across
the TP mismatch), a DP-attention decode (TP 2, DP 2: two attention groups of one rank, both paired
with the one prefill rank), a second connection for a connected rank refused, and in-process pods
(the agent's own synthetic engine per rank) TP 2 ↔ TP 2 with per-rank status, metrics and topology.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import msgspec
import pytest

from dataplane.agent.http import get_json
from dataplane.codec import encode_manifest, manifest_from_schema
from dataplane.errors import LocalApiError
from dataplane.harness.agent_processes import AgentProcess, loopback_pair
from dataplane.harness.sidecar_pair import EngineProcess, SidecarPair
from dataplane.harness.waiting import wait_for
from dataplane.localapi import AgentClient
from dataplane.schema.profiles import schema_from_config
from tests.integration.test_sidecar import assert_verified, config

pytestmark = [pytest.mark.nixl, pytest.mark.slow]
ROOMS = 8


def pod_config(**kw):
    """Two decode ranks finish their parts of a room independently, so a prefill rank can hold parts
    of more rooms than one decode rank keeps in flight: its pools are sized for that skew."""
    cfg = config(requests=ROOMS, **kw)
    return msgspec.structs.replace(
        cfg, model=msgspec.structs.replace(cfg.model, pool_pages=512, max_requests=32)
    )


def assert_pair_verified(pair: SidecarPair, components: set[str]) -> None:
    """Every decode engine rank verified its rooms; every prefill engine rank sent its part of them
    (the ranks of a decode attention group take the same rooms, each DP group its own)."""
    for engine in pair.rank_engines["decode"]:
        assert engine.wait(90) == 0, engine.log_tail()
        assert_verified(engine.report(), ROOMS, components)
    want = ROOMS * pair.cfg["decode"].dp_size
    for engine in pair.rank_engines["prefill"]:
        sent = engine.count
        wait_for(f"{want} rooms sent by {engine.tag}", lambda s=sent: s("succeeded") == want, timeout=30)


def pod_status(pair: SidecarPair, role: str) -> dict:
    return pair.agents[role].status()


@pytest.mark.parametrize(("ptp", "dtp"), [(2, 1), (1, 2)])
def test_sidecar_pods_pair_across_a_tp_mismatch(tmp_path, ptp, dtp):
    """Agents that name no layout adopt each engine rank's schema (the mamba split included)."""
    cfg = pod_config()
    with SidecarPair(cfg, tmp_path, engine_schema=True, prefill_tp=ptp, decode_tp=dtp) as pair:
        assert_pair_verified(pair, {"kv", "aux", "mamba"})
        st = pod_status(pair, "prefill")  # its engines still run (decode's left once done)
        assert st["tp_size"] == ptp and sorted(st["ranks"]) == [str(r) for r in range(ptp)], st["ranks"]
        for rank in st["ranks"].values():  # every prefill rank paired with the decode ranks it serves
            assert len(rank["peers"]) == max(1, dtp // ptp), rank["peers"]
        topo = get_json(
            f"http://127.0.0.1:{pair.agents['prefill'].ports['bootstrap_port']}/topology",
            key=pair.agents["prefill"].key,
        )
        assert sorted(r["rank"] for r in topo["ranks"]) == list(range(ptp)) and topo["tp_size"] == ptp


def test_dp_attention_decode_pairs_each_attention_group(tmp_path):
    """Decode TP 2 with DP 2: each rank is its own attention group (attention TP 1) and registers
    with prefill by its engine rank, as sglang does; both pull the whole KV from the prefill rank."""
    with SidecarPair(pod_config(), tmp_path, decode_tp=2, decode_dp=2) as pair:
        assert_pair_verified(pair, {"kv", "aux", "mamba"})
        prefill = pod_status(pair, "prefill")
        assert {p.split("@")[0] for p in prefill["peers"]} >= {"decode-0", "decode-1"}, prefill["peers"]


def test_a_second_connection_for_a_connected_rank_is_refused(tmp_path):
    cfg = config(requests=0)
    with SidecarPair(cfg, tmp_path, prefill_tp=2) as pair:
        path = pair.cfg["prefill"].localapi.engine.socket_path
        schema = schema_from_config(pair.cfg["prefill"].for_rank(1))
        manifest = encode_manifest(manifest_from_schema(schema, role="prefill"))

        def client(rank: int) -> AgentClient:
            return AgentClient(path, role="prefill", manifest=manifest, tp_rank=rank, tp_size=2, timeout=3)

        with pytest.raises(LocalApiError, match="busy: engine rank 1 is already connected"):
            client(1).connect()
        with pytest.raises(LocalApiError, match=r"engine rank 2 is not served here .* 0, 1 of tpSize 2"):
            client(2).connect()
        # the ranks' own engines are untouched: the pod pairs and stays paired
        wait_for("prefill pod ready", lambda: pod_status(pair, "prefill")["ready"], timeout=30)
        assert all(r["peers"] for r in pod_status(pair, "prefill")["ranks"].values())


def test_in_process_pods_tp2_to_tp2_pair_rank_by_rank(tmp_path):
    (p_cfg, _), (d_cfg, _) = loopback_pair(pod_config(), prefill_tp=2, decode_tp=2)
    prefill = AgentProcess(p_cfg, tmp_path, "prefill")
    decode = AgentProcess(d_cfg, tmp_path, "decode")
    try:
        prefill.wait_ready()
        decode.wait_ready()

        def done() -> bool:
            ranks = decode.status()["ranks"]
            return all(ranks[r]["requests"]["completed"] >= ROOMS for r in ("0", "1"))

        wait_for(f"{ROOMS} requests per decode rank", done, timeout=90)
        st = decode.status()
        for r in ("0", "1"):
            req, comps = st["ranks"][r]["requests"], st["ranks"][r]["components"]
            assert req["succeeded"] == ROOMS and req["verification_failures"] == 0, req
            assert {"kv", "mamba"} <= set(comps)
            assert all(c["verified_bytes"] == c["bytes"] > 0 for c in comps.values()), comps
        assert st["ready"] and prefill.status()["ready"]
        ports = decode.ports["ranks"]
        assert ports["0"]["control_port"] != ports["1"]["control_port"]
        text = urllib.request.urlopen(decode.url + "/metrics", timeout=2).read().decode()
        for r in ("0", "1"):
            assert f'tp_rank="{r}"' in text and 'pdpair_agent_verified_bytes_total{component="kv"' in text
        ready = urllib.request.urlopen(prefill.url + "/readyz", timeout=2)
        assert ready.status == 200
    finally:
        decode.stop()
        prefill.stop()


def test_the_synthetic_engine_runs_one_process_per_rank(tmp_path):
    """``pdpair-agent engine`` without ``--tp-rank`` for a TP 2 role (the operator's sidecar canary):
    it starts one process per rank, both ranks take the same rooms and verify their parts."""
    pair = SidecarPair(pod_config(), tmp_path, decode_tp=2)
    try:
        pair.start_agent("prefill")
        pair.start_engine("prefill")
        pair.start_agent("decode")
        engine = EngineProcess(pair.cfg["decode"], tmp_path, "decode-ranks")  # no rank named
        pair.rank_engines["decode-ranks"] = [engine]
        assert engine.wait(120) == 0, engine.log_tail()
        reports = [json.loads(Path(f"{engine.report_path}.rank{r}").read_text()) for r in (0, 1)]
        for report in reports:
            assert_verified(report, ROOMS, {"kv", "aux", "mamba"})
        wait_for("one room per request on prefill: the decode ranks shared them",
                 lambda: pair.engines["prefill"].count("succeeded") == ROOMS, timeout=30)
    finally:
        pair.stop()
