"""The demo (``pdpair-agent demo``) on loopback, in its two forms.

- ``run_demo``: a prefill and a decode agent per TP rank as processes, each with its in-process
  synthetic source; a progress bar, then one row per component: requests, bytes, verified, GB/s over
  the time its writes were in flight, p50/p99 of prefill's write latency, the run's aggregate rate
  beside this machine's memcpy rate for a copy of the run's size (64 to 128 MiB: beyond the CPU's
  caches, as the pools are).
- ``run_sidecar_demo``: per role a sidecar agent and a synthetic engine process share a Unix socket (as
  two containers of a pod share an ``emptyDir``); the engines own the pools (shared memory), decode
  originates and verifies every request, and the table shows per component what the decode *engine*
  received and verified.

Exit status 1 when any request failed or any byte failed verification.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..config import AgentConfig
from .agent_processes import AgentProcess, loopback_pair
from .sidecar_pair import SidecarPair

MEMCPY_MIN = 64 << 20
MEMCPY_MAX = 128 << 20


def run_sidecar_demo(cfg: AgentConfig, *, as_json: bool, timeout: float, hold: float = 0.0) -> int:
    syn = cfg.synthetic
    args = ["--requests", str(syn.requests), "--inflight", str(syn.max_inflight),
            "--tokens", ",".join(str(t) for t in syn.tokens)]
    with tempfile.TemporaryDirectory(prefix="pdpair-demo-sidecar-") as tmp, \
            SidecarPair(cfg, Path(tmp), decode_args=args) as pair:
        decode = pair.engines["decode"]
        start = time.monotonic()
        while decode.proc.poll() is None and time.monotonic() - start < timeout:
            done = decode.count("finished")
            print(f"\r{done}/{syn.requests} requests", end="", file=sys.stderr, flush=True)
            time.sleep(0.2)
        print(file=sys.stderr)
        report = decode.report()
        urls = {role: a.url for role, a in pair.agents.items() if a.ports}
        if hold > 0:
            time.sleep(hold)
    rows = rows_of(report)
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(report, rows, urls)
    counts = report["counts"]
    ok = counts.get("succeeded", 0) == syn.requests and not counts.get("verification_failures")
    return 0 if ok and all(r["verified"] for r in rows) else 1


def rows_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    window = report.get("window_seconds") or 0.0
    return [
        {
            "component": name,
            "state_type": c["state_type"],
            "requests": c["ok"] + c["bad"],
            "bytes": c["bytes"],
            "verified": c["bad"] == 0 and c["ok"] > 0,
            "gbps": round(c["bytes"] / window / 1e9, 4) if window else 0.0,
        }
        for name, c in report["components"].items()
    ]


def print_table(report: dict[str, Any], rows: list[dict[str, Any]], urls: dict[str, str]) -> None:
    counts = report["counts"]
    print(f"\nPDPair sidecar demo: engine + agent per role, NIXL on loopback; "
          f"{counts.get('succeeded', 0)}/{report['made']} requests succeeded, "
          f"local API {report.get('api_us_per_call')} us per expect")
    head = f"{'component':<10} {'type':<8} {'requests':>8} {'bytes':>14} {'verified':>8} {'GB/s':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['component']:<10} {r['state_type']:<8} {r['requests']:>8} {r['bytes']:>14,} "
              f"{'yes' if r['verified'] else 'NO':>8} {r['gbps']:>8.3f}")
    for role, url in urls.items():
        print(f"  {role} agent: {url}/metrics")


def run_demo(
    cfg: AgentConfig, *, title: str, prefill_tp: int, decode_tp: int, as_json: bool, timeout: float,
    hold: float = 0.0,
) -> int:
    """The two-process demo: ``prefill_tp`` prefill and ``decode_tp`` decode agents with their in-process
    synthetic sources; exit status 1 when a request failed or a byte failed verification."""
    prefill_cfgs, decode_cfgs = loopback_pair(cfg, prefill_tp=prefill_tp, decode_tp=decode_tp)
    with tempfile.TemporaryDirectory(prefix="pdpair-demo-") as tmp:
        work = Path(tmp)
        prefill = [AgentProcess(c, work, f"prefill-{c.tp_rank}", one_rank=True) for c in prefill_cfgs]
        decode = [AgentProcess(c, work, f"decode-{c.tp_rank}", one_rank=True) for c in decode_cfgs]
        try:
            for agent in prefill + decode:
                agent.wait_ready()
            finished = follow(decode, cfg.synthetic.requests * len(decode), timeout)
            statuses = [a.status() for a in decode]
            rows = component_rows([a.status() for a in prefill], statuses)
            requests = [s["requests"] for s in statuses]
            window = max(s.get("transfer_window_seconds", 0.0) for s in statuses)
            report(title, as_json, rows, requests, prefill + decode, window)
            if hold > 0:
                time.sleep(hold)
        finally:
            for agent in decode + prefill:
                agent.stop()
    failed = sum(r["made"] - r["succeeded"] for r in requests)
    return 0 if finished and failed == 0 and all(r["verified"] for r in rows) else 1

def follow(decode: list[Any], target: int, timeout: float) -> bool:
    """Progress bar on stderr until every decode rank finished its requests (or the timeout)."""
    start = time.monotonic()
    done = 0
    while time.monotonic() - start < timeout:
        statuses = [a.status() for a in decode]
        done = sum(s["requests"]["completed"] for s in statuses)
        verified = sum(c["verified_bytes"] for s in statuses for c in s["components"].values())
        bar(done, target, time.monotonic() - start, verified)
        if done >= target:
            print(file=sys.stderr)
            return True
        time.sleep(0.1)
    print(f"\ndemo: timed out after {timeout:.0f}s with {done}/{target} requests done", file=sys.stderr)
    return False


def bar(done: int, target: int, elapsed: float, verified: int) -> None:
    width = 30
    filled = int(width * done / max(target, 1))
    print(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{target} requests  "
        f"{verified / 1e6:8.1f} MB verified  {elapsed:5.1f}s",
        end="",
        file=sys.stderr,
        flush=True,
    )


def component_rows(prefill: list[dict[str, Any]], decode: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decode's received and verified bytes per component, with prefill's write latency percentiles.

    GB/s is the component's bytes over the time its writes were in flight (prefill's per-room write
    latencies, summed): what the engine delivered for that component, not diluted by the synthetic
    engine's fill and verify time or by the other components."""
    rows: dict[str, dict[str, Any]] = {}
    for s in decode:
        for name, c in s["components"].items():
            row = rows.setdefault(
                name,
                {
                    "component": name,
                    "state_type": c["state_type"],
                    "requests": 0,
                    "bytes": 0,
                    "verified_bytes": 0,
                    "mismatched_bytes": 0,
                },
            )
            for k in ("requests", "bytes", "verified_bytes", "mismatched_bytes"):
                row[k] += c[k]
    out = []
    for name, row in rows.items():
        lat = [s["components"][name] for s in prefill if name in s["components"]]
        busy = sum(c.get("in_flight_seconds", 0.0) for c in lat)
        out.append(
            {
                "component": name,
                "state_type": row["state_type"],
                "requests": row["requests"],
                "bytes": row["bytes"],
                "verified": row["bytes"] > 0
                and row["verified_bytes"] == row["bytes"]
                and not row["mismatched_bytes"],
                "gbps": round(row["bytes"] / busy / 1e9, 4) if busy else 0.0,
                "p50_ms": _worst(lat, "p50_ms"),
                "p99_ms": _worst(lat, "p99_ms"),
            }
        )
    return out


def memcpy_gbps(nbytes: int, rounds: int = 5, budget_seconds: float = 0.5) -> float:
    """The best of up to ``rounds`` numpy copies of ``nbytes`` bytes, within about ``budget_seconds``,
    in GB/s. The demo copies at least ``MEMCPY_MIN``: a smaller copy stays in the CPU's caches, which
    pools of this size never do."""
    import numpy as np

    n = max(nbytes, 1)
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch of dst's pages, outside the timing
    best = float("inf")
    stop = time.perf_counter() + budget_seconds
    for _ in range(rounds):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() > stop:
            break
    return n / best / 1e9


def _worst(stats: list[dict[str, Any]], key: str) -> float | None:
    values = [s[key] for s in stats if s.get(key) is not None]
    return round(max(values), 3) if values else None


def report(
    title: str,
    as_json: bool,
    rows: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    agents: list[Any],
    window: float = 0.0,
) -> None:
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    made = sum(r["made"] for r in requests)
    ok = sum(r["succeeded"] for r in requests)
    print(
        f"\nPDPair demo: {title}; {ok}/{made} requests succeeded"
    )
    head = (
        f"{'component':<10} {'type':<8} {'requests':>8} {'bytes':>14} {'verified':>8} {'GB/s':>8} "
        f"{'p50 ms':>8} {'p99 ms':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.3f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.3f}"
        print(
            f"{r['component']:<10} {r['state_type']:<8} {r['requests']:>8} {r['bytes']:>14,} "
            f"{'yes' if r['verified'] else 'NO':>8} {r['gbps']:>8.3f} {p50:>8} {p99:>8}"
        )
    print(
        "GB/s: one component's bytes over the time its own writes were in flight (rows overlap in time,\n"
        "  so they do not add up); latency: prefill write start to completion."
    )
    total = sum(r["bytes"] for r in rows)
    if total and window > 0:
        copied = min(max(total, MEMCPY_MIN), MEMCPY_MAX)
        print(
            f"Aggregate: {total / 1e6:,.1f} MB in {window:.2f} s = {total / window / 1e9:.2f} GB/s, every "
            "component over decode's transfer window\n  (first request to last completion; the synthetic "
            "engine fills and verifies every byte inside it)."
        )
        print(
            f"memcpy on this machine: {memcpy_gbps(copied):.2f} GB/s (numpy, {copied / 1e6:,.1f} MB, one "
            "process): the ceiling for a move on one host."
        )
    if all(getattr(a, "compiled", False) for a in agents):
        print("Agents' room path: compiled (mypyc).")
    else:
        print("Agents' room path: interpreted (`python -P -m dataplane.compiled` builds it: PDPAIR_COMPILED)")
    print("Metrics endpoints (Prometheus text, per component; live while the agents run, see --hold):")
    for a in agents:
        print(f"  {a.tag:<10} {a.url}/metrics   {a.url}/status")
