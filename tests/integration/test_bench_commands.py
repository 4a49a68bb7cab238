"""The transfer benchmarks as a user runs them, on tiny cases: they finish, measure real transfers and
report consistent figures (the figures themselves are for docs/benchmarks.md, not for a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dataplane.localapi.shm import huge_pages

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nixl, pytest.mark.slow]
TINY = ["--sizes", "64K", "--case-bytes", str(4 << 20), "--max-requests", "24", "--warmup", "2", "--json"]


def cli(*args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "dataplane.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_bench_transfer_reports_agent_raw_and_memcpy_per_case() -> None:
    """With the compiled agent modules (the benchmark's default, built here if the cache has none)."""
    args = ("--mix", "qwen3-next", "--tp-rooms", "", "--repeat", "1", "--inflight", "2")
    rows = cli("bench", "transfer", *TINY, *args)
    assert [r["case"] for r in rows] == ["64KiB", "mix:qwen3-next"]
    for r in rows:
        assert r["compiled"] is True
        assert r["agent_gbps"] > 0 and r["raw_engine_gbps"] > 0 and r["memcpy_gbps"] > 0
        assert r["ratio_agent_vs_raw"] == pytest.approx(r["agent_gbps"] / r["raw_engine_gbps"], rel=0.02)
        threaded = r["raw_engine_threaded_gbps"]  # a second raw run, NIXL's own thread copying
        assert threaded > 0
        assert r["ratio_agent_vs_raw_threaded"] == pytest.approx(r["agent_gbps"] / threaded, rel=0.02)
        assert len(r["ratio_runs"]) == len(r["ratio_threaded_runs"]) == 1
        assert r["ratio_threaded_runs"][0] == pytest.approx(r["ratio_agent_vs_raw_threaded"], rel=0.02)
        assert r["prefill_worker_cpu_us"] > 0 and r["prefill_cpu_us"] >= 0  # from /proc; None fails
        assert r["decode_worker_cpu_us"] > 0
        assert r["verified"] is True and r["agent_bytes_per_request"] == r["bytes_per_request"] > 0, r


def test_sidecar_bench_reports_both_orders_against_the_in_process_engine() -> None:
    """Huge-page pools where the host has them (scripts/test reserves some), ordinary ones elsewhere;
    the report says which the engines had."""
    huge = huge_pages() >= 8
    pages = "always" if huge else "never"
    args = ("--mix", "", "--inflight", "2", "--huge-pages", pages, "--compiled", "off")
    (row,) = cli("sidecar-bench", *TINY, *args, "--engine-poll-us", "200", "--reply-spin-us", "100")
    assert row["sidecar_huge_pages"] is huge and row["compiled"] is False
    assert row["engine_poll_us"] == 200 and row["reply_spin_us"] == 100
    assert row["case"] == "64KiB" and row["requests"] == 24 and row["inflight"] == 2
    assert row["bytes"] % 24 == 0 and row["bytes"] >= 24 * (64 << 10)  # at least a page per request
    for key in ("direct_gbps", "sidecar_gbps", "presend_gbps", "api_us"):
        assert row[key] > 0, key
    assert row["ratio"] == pytest.approx(row["sidecar_gbps"] / row["direct_gbps"], rel=0.02)
    for setup in ("direct", "sidecar", "presend"):  # the prefill agent's CPU per room, from /proc
        process, worker = row[f"{setup}_prefill_process_us"], row[f"{setup}_prefill_worker_us"]
        assert worker > 0 and 0 <= process < 1e6, (setup, process, worker)  # NaN fails too


def test_cma_copy_measures_each_memory_kind() -> None:
    kinds = ["anon-thp", "anon-4k", "memfd"] + (["memfd-hugetlb"] if huge_pages() >= 8 else [])
    script = [sys.executable, str(ROOT / "bench" / "cma_copy.py")]
    args = ["--kinds", ",".join(kinds), "--chunks", "64K,1M", "--buffer", "4M", "--seconds", "0.05", "--json"]
    proc = subprocess.run([*script, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert [(r["kind"], r["chunk"]) for r in rows] == [(k, c) for c in (64 << 10, 1 << 20) for k in kinds]
    assert all(r["gbps"] > 0 for r in rows), rows
    bad = subprocess.run([*script, "--kinds", "tmpfs"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown kinds ['tmpfs']" in bad.stderr


def test_room_trace_times_every_step_of_one_room() -> None:
    script = [sys.executable, str(ROOT / "bench" / "room_trace.py")]
    proc = subprocess.run(
        [*script, "--requests", "400", "--json"], capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    steps = {s["step"]: s for s in out["steps"]}
    from bench.room_trace import STEPS

    assert list(steps) == [name for name, _, _ in STEPS], "a trace point is no longer marked"
    assert all(s["rooms"] >= 350 and s["p50_us"] >= 0 for s in steps.values()), steps  # one clock
    whole = steps["all of it"]["p50_us"]
    assert whole >= steps["prefill: the transport's write"]["p50_us"] > 0 and out["agent_p50_us"] > 0
    bad = subprocess.run([*script, "--requests", "5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--requests must be at least 20" in bad.stderr
    bad = subprocess.run([*script, "--from", "/no/such/dir"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--from /no/such/dir: no such folder" in bad.stderr


def test_agent_rate_measures_rooms_and_worker_cpu_per_window() -> None:
    script = [sys.executable, str(ROOT / "bench" / "agent_rate.py")]
    args = ["--size", "64K", "--inflight", "2", "--windows", "2", "--seconds", "0.5", "--compiled", "off"]
    args.append("--json")
    proc = subprocess.run([*script, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["compiled"] is False and len(out["windows"]) == 2
    for w in out["windows"]:
        assert w["rooms_per_second"] > 0 and w["prefill_worker_cpu_us"] > 0 and w["decode_worker_cpu_us"] > 0
    rates = [w["rooms_per_second"] for w in out["windows"]]
    assert out["rooms_per_second"] == pytest.approx(sum(rates) / 2)  # the median of two windows


def test_bench_transfer_tp_rooms_move_and_verify_every_rank_pairs_bytes() -> None:
    """Prefill TP 1 → decode TP 2 (Qwen3-Next: KV heads and Mamba state split) and TP 2 → 1 (KV only):
    the agents move exactly the planned bytes of every rank pair (compact plans: fewer rows than
    writes), the raw engine the same, and a verified run checks every byte on each decode rank."""
    rows = cli(
        "bench", "transfer", *TINY, "--sizes", "", "--mix", "", "--tp-rooms", "qwen3-next:1-2,pure-kv:2-1",
        "--repeat", "1", "--inflight", "2", "--compiled", "off",
    )
    assert [(r["case"], r["prefill_tp"], r["decode_tp"]) for r in rows] == [
        ("qwen3-next TP1->2", 1, 2), ("pure-kv TP2->1", 2, 1)
    ]
    for r in rows:
        assert r["verified"] is True and r["verified_rooms"] == 8, r
        # every prefill rank writes the request's one aux item (64 bytes); decode counts it once
        repeated_aux = 64 * (r["prefill_tp"] - r["decode_tp"]) if r["prefill_tp"] > r["decode_tp"] else 0
        assert r["agent_bytes_per_request"] == r["bytes_per_request"] - repeated_aux > 0, r
        assert r["writes_per_request"] > 10 * r["plan_rows_per_request"], r  # head slices stay compact
        assert r["agent_gbps"] > 0 and r["raw_engine_gbps"] > 0 and r["memcpy_gbps"] > 0
    assert set(rows[0]["verified_components"]) == {"kv", "aux", "mamba"}
    assert set(rows[1]["verified_components"]) == {"kv", "aux"}
