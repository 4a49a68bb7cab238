"""Where one room's time goes: ``bench transfer`` with one room in flight, timestamps around every step of
both agents' workers, medians per step.

    .venv/bin/python bench/room_trace.py [--size 4K] [--requests 3000] [--spin-us 0] [--json]

Runs ``pdpair-agent bench transfer --sizes SIZE --mix= --inflight 1`` with ``PDPAIR_ROOM_TRACE`` set
for the agents it starts: their role workers then mark the trace points of ``dataplane.room.trace``
(``agent.tracing`` records them; interpreted modules, ``--compiled off``). It joins prefill's and
decode's marks by room id — one host, one monotonic clock — and prints the median and p90 of each step,
the first tenth of the rooms (pairing, warm-up) left out — use a few hundred rooms at least: in the
first hundred or so the status's send itself can take 100+ µs (while the lane to decode comes up). One
room at a time, so every step belongs to that room; with rooms in flight the steps would interleave.
The marks cost about a µs each: compare steps, not the sum with the benchmark's p50 (printed too, with
the raw engine's); docs/benchmarks.md.

``--sidecar reactive|presend`` traces the same room through the local API instead (``sidecar-bench``'s
sidecar setup, one room in flight, interpreted): the agents' steps, and when each took the engine's
request and pushed a room state to it (docs/sidecar.md). ``reactive``: the prefill engine sends when
the agent tells it decode asked; ``presend``: it sent ahead.

``--from DIR`` summarises, with the sidecar steps, the marks of agents some other run started with
``PDPAIR_ROOM_TRACE=DIR`` (a serving engine's test, say: docs/sglang.md), of the prefill and decode
agent that marked the most rooms.
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
ENV = "PDPAIR_ROOM_TRACE"
"""``dataplane.agent.tracing.ENV``: the folder the agents' workers write their marks to."""
STEPS = (
    ("decode: make the metadata, send it", "D0a", "D0b"),
    ("metadata reaches prefill's poll", "D0b", "Pw"),
    ("prefill: read it, decode it", "Pw", "P0"),
    ("prefill: room table, sources", "P0", "Qa"),
    ("prefill: plan_request", "Qa", "Qb"),
    ("prefill: transfer_requests", "Ra", "Rb"),
    ("prefill: up to write", "Rb", "Wa"),
    ("prefill: the transport's write", "Wa", "Wb"),
    ("prefill: write returns to finish", "Wb", "P2"),
    ("prefill: finish up to the status's send", "P2", "Ps"),
    ("status sent, reaches decode's handler", "Ps", "D1"),
    ("prefill: rest of finish (after the status)", "Ps", "P3"),
    ("decode: finish the room", "D1", "D2"),
    ("all of it", "D0a", "D2"),
)
SIDECAR_STEPS = (
    ("decode: the worker takes the engine's expect", "Dw0", "D0a"),
    ("decode: make the metadata, send it", "D0a", "D0b"),
    ("metadata reaches prefill's poll", "D0b", "Pw"),
    ("prefill: read it, start the room", "Pw", "P0"),
    ("prefill: WaitingForInput pushed to the engine", "P0", "Pf2"),
    ("prefill: WaitingForInput pushed up to the engine's send taken", "Pf2", "Pw0"),
    ("prefill: room started up to the transport's write", "P0", "Wa"),
    ("prefill: the engine's send taken up to the transport's write", "Pw0", "Wa"),
    ("prefill: the transport's write", "Wa", "Wb"),
    ("prefill: write returns to finish", "Wb", "P2"),
    ("prefill: finish up to the status's send", "P2", "Ps"),
    ("status sent, reaches decode's handler", "Ps", "D1"),
    ("decode: finish the room", "D1", "D2"),
    ("decode: Success pushed to the engine", "D2", "Df4"),
    ("prefill: Success pushed to the engine", "P3", "Pf4"),
    ("decode agent: expect taken to Success pushed", "Dw0", "Df4"),
    ("decode agent: Success pushed up to the next expect taken", "Df4", "+Dw0"),
    ("prefill agent: an engine's send taken up to the next one taken", "Pw0", "+Pw0"),
)
"""A step ``a`` → ``+b`` runs from this room's ``a`` to the next room's ``b`` (rooms are in order)."""


Marks = dict[str, dict[str, float]]


def summarise(traces: list[Marks], steps: tuple[tuple[str, str, str], ...] = STEPS) -> list[dict[str, Any]]:
    """Median and p90 (µs) of each step over the rooms every process marked, the first tenth left out.
    Each process's marks carry its own names (its letter first), so one room's merge to one dict."""
    rooms = sorted(int(k) for k in set.intersection(*(set(t) for t in traces)))
    rooms = rooms[len(rooms) // 10 :]
    merged = {r: {k: v for t in traces for k, v in t[str(r)].items()} for r in rooms}
    nothing: dict[str, float] = {}
    for r, m in merged.items():
        m.update({f"+{k}": v for k, v in merged.get(r + 1, nothing).items()})
    out = []
    for name, a, b in steps:
        spans = sorted((m[b] - m[a]) * 1e6 for m in merged.values() if a in m and b in m)
        if len(spans) < len(rooms) // 2:
            continue  # a step of the warm-up or of a few stragglers, not of this setup's rooms
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
    p.add_argument(
        "--sidecar", choices=("reactive", "presend"), help="through the local API (four processes)"
    )
    p.add_argument("--from", dest="folder", metavar="DIR", type=Path,
                   help="summarise the traces another run left in DIR (sidecar steps) instead of running")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    if args.requests < 20:
        p.error("--requests must be at least 20")
    if args.folder is not None:
        if not args.folder.is_dir():
            p.error(f"--from {args.folder}: no such folder")
        traces = load(args.folder, ("prefill-agent", "decode-agent"))
        if traces is None:
            return 1
        result = {"case": str(args.folder), "steps": summarise(traces, SIDECAR_STEPS)}
        return show(result, f"{args.folder}: marks of {len(traces[0])} rooms", args.json)
    with tempfile.TemporaryDirectory() as out:
        env = {
            **os.environ, ENV: out,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        if args.sidecar:
            return sidecar(args, env, Path(out))
        cmd = [
            sys.executable, "-m", "dataplane.cli", "bench", "transfer", "--sizes", args.size, "--mix=",
            "--tp-rooms=", "--inflight", "1", "--repeat", "1", "--max-requests", str(args.requests),
            "--compiled", "off", "--case-bytes", str(1 << 40), "--spin-us", str(args.spin_us), "--json",
        ]
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return run.returncode
        bench = json.loads(run.stdout)[0]
        traces = load(Path(out), ("prefill-agent", "decode-agent"))
    if traces is None:
        return 1
    result = {
        "case": bench["case"], "agent_p50_us": bench["agent_p50_us"], "raw_p50_us": bench["raw_p50_us"],
        "steps": summarise(traces),
    }
    head = f"{result['case']}: agent p50 {bench['agent_p50_us']:.0f} us"
    return show(result, f"{head}, raw NIXL p50 {bench['raw_p50_us']:.0f} us", args.json)


def sidecar(args: argparse.Namespace, env: dict[str, str], out: Path) -> int:
    """The sidecar setup of ``sidecar-bench`` for one case, its processes started with the hooks."""
    from dataplane.commands.args import parse_size
    from dataplane.compiled import choose
    from dataplane.harness.bench.cases import block_config
    from dataplane.harness.bench.sidecar import sidecar_run, with_warmup

    choose("off")
    cfg = with_warmup(block_config(parse_size(args.size), args.requests), 5)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        run = sidecar_run(cfg, args.sidecar == "presend")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    traces = load(out, ("prefill-agent", "decode-agent"))
    if traces is None:
        return 1
    result = {
        "case": f"{args.size} sidecar {args.sidecar}", "us_per_request": round(run["us"], 1),
        "steps": summarise(traces, SIDECAR_STEPS),
    }
    head = f"{result['case']}: {run['us']:.0f} us per room (one in flight, interpreted)"
    return show(result, head, args.json)


def load(out: Path, processes: tuple[str, ...]) -> list[Marks] | None:
    """Each process's marks (the file its tracer wrote at exit; of several runs, the one with the most
    rooms: the timed run, not the short verification run that ends each case), or None when one is
    missing."""
    traces = []
    for name in processes:
        found = sorted(out.glob(f"{name}-*.json"))
        if not found:
            print(f"room_trace: no trace from the {name} (was {ENV} passed to it?)", file=sys.stderr)
            return None
        runs = [json.loads(f.read_text())["marks"] for f in found]
        traces.append(max(runs, key=len))
    return traces


def show(result: dict[str, Any], head: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result, indent=1))
        return 0
    print(head)
    for s in result["steps"]:
        print(f"  {s['step']:50} p50 {s['p50_us']:8.1f} us   p90 {s['p90_us']:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
