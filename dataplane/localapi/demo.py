"""``pdpair-agent demo --sidecar``: the demo with engine and agent as two processes per role.

Per role a sidecar agent and a synthetic engine process share a Unix socket (as two containers of a
pod share an ``emptyDir``); the engines own the pools (shared memory), decode originates and verifies
every request, and the table shows per component what the decode *engine* received and verified.
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
from .launch import SidecarPair


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
