"""The direct agents' room rate with rooms in flight, and each role worker's CPU per room — the agents
alone (no raw NIXL, no memcpy), in short windows, so two builds can alternate within minutes.

    .venv/bin/python bench/agent_rate.py [--size 4K] [--inflight 8] [--windows 3] [--seconds 4]
                                         [--compiled on|auto|off] [--json]

One prefill and one decode agent (``pdpair-agent run``, the block-size case of ``bench transfer``,
verification off, an endless request stream) are started; after a settling pause, each window reads
decode's completed rooms and both workers' CPU seconds from ``/status`` before and after. Medians over
the windows are printed last (docs/benchmarks.md: compiled against interpreted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataplane.commands.args import parse_size  # noqa: E402
from dataplane.compiled import CompileUnavailable, choose  # noqa: E402
from dataplane.harness.agent_processes import AgentProcess, loopback_pair  # noqa: E402
from dataplane.harness.bench.cases import block_config  # noqa: E402

SETTLE = 2.0


def _cpu(agent: AgentProcess) -> float:
    return float(agent.status().get("worker_cpu_seconds") or 0.0)


def measure(size: int, inflight: int, windows: int, seconds: float) -> list[dict[str, float]]:
    (p_cfg,), (d_cfg,) = loopback_pair(block_config(size, 10**9, inflight=inflight))
    out = []
    with tempfile.TemporaryDirectory(prefix="pdpair-rate-") as tmp:
        prefill = AgentProcess(p_cfg, Path(tmp), "prefill")
        decode = AgentProcess(d_cfg, Path(tmp), "decode")
        try:
            prefill.wait_ready()
            decode.wait_ready()
            time.sleep(SETTLE)
            for _ in range(windows):
                n0, t0 = decode.status()["requests"]["completed"], time.monotonic()
                p0, d0 = _cpu(prefill), _cpu(decode)
                time.sleep(seconds)
                n1, t1 = decode.status()["requests"]["completed"], time.monotonic()
                p1, d1 = _cpu(prefill), _cpu(decode)
                rooms = max(1, n1 - n0)
                out.append({
                    "rooms_per_second": (n1 - n0) / (t1 - t0),
                    "prefill_worker_cpu_us": (p1 - p0) / rooms * 1e6,
                    "decode_worker_cpu_us": (d1 - d0) / rooms * 1e6,
                })
        finally:
            decode.stop()
            prefill.stop()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="4K", help="block (page) size of the rooms (default 4K)")
    p.add_argument("--inflight", type=int, default=8, help="rooms in flight (default 8)")
    p.add_argument("--windows", type=int, default=3, help="measurement windows (default 3)")
    p.add_argument("--seconds", type=float, default=4.0, help="length of each window (default 4 s)")
    p.add_argument("--compiled", choices=("on", "auto", "off"), default="on",
                   help="the agents' per-room modules compiled with mypyc (dataplane/compiled)")
    p.add_argument("--json", action="store_true", help="print the windows and medians as JSON")
    args = p.parse_args()
    try:
        compiled = choose(args.compiled)
    except CompileUnavailable as exc:
        print(f"agent_rate: --compiled {args.compiled}: {exc}", file=sys.stderr)
        return 2
    runs = measure(parse_size(args.size), args.inflight, args.windows, args.seconds)
    medians: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    result = {"size": args.size, "inflight": args.inflight, "compiled": compiled, "windows": runs, **medians}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for r in runs:
        print(
            f"rooms/s {r['rooms_per_second']:8.0f}   prefill worker CPU {r['prefill_worker_cpu_us']:6.1f} "
            f"us/room   decode worker {r['decode_worker_cpu_us']:6.1f}"
        )
    print(f"{args.size}, {args.inflight} in flight, {'compiled' if compiled else 'interpreted'}: median "
          f"{medians['rooms_per_second']:.0f} rooms/s, prefill worker {medians['prefill_worker_cpu_us']:.1f} "
          f"us/room, decode worker {medians['decode_worker_cpu_us']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
