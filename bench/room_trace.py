"""Where one room's time goes: ``bench transfer`` with one room in flight, timestamps around every step of
both agents' workers, medians per step.

    .venv/bin/python bench/room_trace.py [--size 4K] [--requests 3000] [--spin-us 0] [--json]

Runs ``pdpair-agent bench transfer --sizes SIZE --mix= --inflight 1`` with the hooks of
``bench/room_trace_hooks/`` on the agents' ``PYTHONPATH`` (instrumentation: it wraps the workers'
methods, like a profiler; deployed agents never load it; so the agents run the interpreted modules,
``--compiled off``: compiled classes' methods cannot be wrapped), then joins prefill's and decode's marks by
room id — one host, one monotonic clock — and prints the median and p90 of each step, the first tenth of
the rooms (pairing, warm-up) left out — use a few hundred rooms at least: in the first hundred or so the
status's send itself can take 100+ µs (the dev VM, while the lane to decode comes up). One room at a
time, so every step belongs to that room; with rooms in flight the steps would interleave. The marks
cost a few µs each: compare steps, not the sum with the benchmark's p50 (printed too, with the raw
engine's). docs/benchmarks.md, session 14.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOOKS = Path(__file__).with_name("room_trace_hooks")
STEPS = (
    ("decode: make the metadata, send it", "D0a", "D0b"),
    ("metadata reaches prefill's poll", "D0b", "Pw"),
    ("prefill: read it, decode it", "Pw", "P0"),
    ("prefill: room table, sources", "P0", "Qa"),
    ("prefill: plan_request", "Qa", "Qb"),
    ("prefill: transfer_requests", "Ra", "Rb"),
    ("prefill: up to write", "Rb", "Wa"),
    ("prefill: write up to the engine's post", "Wa", "Xa"),
    ("prefill: the engine's post", "Xa", "Xb"),
    ("prefill: write returns to finish", "Xb", "P2"),
    ("prefill: finish up to the status's send", "P2", "Ps"),
    ("status sent, reaches decode's handler", "Ps", "D1"),
    ("prefill: rest of finish (after the status)", "Ps", "P3"),
    ("decode: finish the room", "D1", "D2"),
    ("all of it", "D0a", "D2"),
)


Marks = dict[str, dict[str, float]]


def summarise(prefill: Marks, decode: Marks) -> list[dict[str, Any]]:
    """Median and p90 (µs) of each step over the rooms both sides marked, the first tenth left out."""
    rooms = sorted(int(k) for k in decode if k in prefill)
    rooms = rooms[len(rooms) // 10 :]
    out = []
    for name, a, b in STEPS:
        spans = sorted(
            (m[b] - m[a]) * 1e6
            for m in ({**decode[str(r)], **prefill[str(r)]} for r in rooms)
            if a in m and b in m
        )
        if spans:
            out.append({
                "step": name, "rooms": len(spans), "p50_us": round(statistics.median(spans), 1),
                "p90_us": round(spans[int(len(spans) * 0.9)], 1),
            })
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="4K", help="block size of the rooms (bench transfer's --sizes)")
    p.add_argument("--requests", type=int, default=3000, help="rooms (at least 20)")
    p.add_argument("--spin-us", type=int, default=0, help="the agents' transfer.spinMicroseconds (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    if args.requests < 20:
        p.error("--requests must be at least 20")
    with tempfile.TemporaryDirectory() as out:
        env = {
            **os.environ, "PDPAIR_ROOM_TRACE": out,
            "PYTHONPATH": os.pathsep.join([str(HOOKS), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        cmd = [
            sys.executable, "-m", "dataplane.cli", "bench", "transfer", "--sizes", args.size, "--mix=",
            "--inflight", "1", "--repeat", "1", "--max-requests", str(args.requests), "--compiled", "off",
            "--case-bytes", str(1 << 40), "--spin-us", str(args.spin_us), "--json",
        ]
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return run.returncode
        bench = json.loads(run.stdout)[0]
        traces = {}
        for role in ("prefill", "decode"):
            path = Path(out) / f"{role}.json"
            if not path.is_file():
                print(f"room_trace: no trace from the {role} agent (its hooks did not load)", file=sys.stderr)
                return 1
            traces[role] = json.loads(path.read_text())
    steps = summarise(traces["prefill"], traces["decode"])
    result = {
        "case": bench["case"], "agent_p50_us": bench["agent_p50_us"], "raw_p50_us": bench["raw_p50_us"],
        "steps": steps,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['case']}: agent p50 {bench['agent_p50_us']:.0f} us, "
          f"raw engine p50 {bench['raw_p50_us']:.0f} us")
    for s in steps:
        print(f"  {s['step']:42} p50 {s['p50_us']:8.1f} us   p90 {s['p90_us']:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
