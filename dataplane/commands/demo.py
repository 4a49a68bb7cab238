"""``pdpair-agent demo``: the README's main command.

Starts a prefill and a decode agent as two processes on loopback (NIXL, a model profile), pushes a
stream of hybrid requests through the full path — bootstrap, registration with the manifest, per-room
metadata, per-component writes, status — verifies every byte on decode, and prints one row per
component: requests, bytes, verified, GB/s over the time its writes were in flight, and p50/p99
of the prefill's per-component write latency. Below the table: the run's aggregate rate (every
component's bytes over decode's transfer window) beside this machine's memcpy rate for a copy of
the run's size (64 to 128 MiB: beyond the CPU's caches, as the pools are), the ceiling for a move
between two processes on one host. ``--json`` prints the same rows as a JSON list. Exit status 1
when any byte failed verification or any request failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..schema.profiles import profile_names
from .args import integer, listed, number, one_of, plain

DEFAULT_TOKENS = "1024,4096,0,300,2048"
POOL_PAGES = 512
MAX_REQUESTS = 32
MAX_TP = 8
MAX_TOKENS = 1 << 20
MEMCPY_MIN = 64 << 20
MEMCPY_MAX = 128 << 20


TRANSPORTS = {"nixl": "NIXL on loopback", "cuda-ipc": "CUDA IPC on this node's GPU"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="prefill + decode on loopback, verified per component",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    profiles = profile_names()
    p.add_argument("--profile", type=one_of(profiles, "profile"), default="qwen3-next", metavar="PROFILE",
                   help=f"model profile, one of {', '.join(profiles)} (default: qwen3-next)")
    p.add_argument("--requests", type=integer(1, 1_000_000), default=200,
                   help="requests to push, 1 to 1,000,000 (default: 200)")
    p.add_argument(
        "--tokens", type=listed(integer(0, MAX_TOKENS), "token lengths"), default=DEFAULT_TOKENS,
        help=f"token lengths, cycled, each 0 to {MAX_TOKENS:,} (default: {DEFAULT_TOKENS})",
    )
    p.add_argument("--inflight", type=integer(1, MAX_REQUESTS), default=4,
                   help=f"rooms in flight, 1 to {MAX_REQUESTS} (default: 4)")
    p.add_argument("--prefill-tp", type=integer(1, MAX_TP), default=1,
                   help=f"prefill TP ranks, one process each, 1 to {MAX_TP} (default: 1)")
    p.add_argument("--decode-tp", type=integer(1, MAX_TP), default=1,
                   help=f"decode TP ranks, one process each, 1 to {MAX_TP} (default: 1)")
    p.add_argument("--ucx-tls", default=None, help="UCX_TLS for NIXL (e.g. tcp); default: UCX's choice")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="pools in host memory (default) or CUDA memory (needs torch and a GPU)")
    p.add_argument("--backend", choices=("nixl", "cuda-ipc"), default="nixl",
                   help="transfer engine: nixl (default) or cuda-ipc (needs --device cuda and Triton; "
                        "docs/gpu.md)")
    p.add_argument("--timeout", type=number(1, 86_400), default=120.0,
                   help="give up after this many seconds (default: 120)")
    p.add_argument("--hold", type=number(0, 86_400), default=0.0,
                   help="keep the agents up this many seconds after the run (default: 0)")
    p.add_argument("--json", action="store_true", help="print a JSON list of per-component results")
    p.add_argument("--sidecar", action="store_true",
                   help="engine and agent as two processes per role, over the local API (docs/sidecar.md)")
    p.set_defaults(handler=run)


def demo_config(args: argparse.Namespace) -> Any:
    from ..config import AgentConfig, ModelConfig, NixlConfig, SyntheticConfig, TransferConfig

    return AgentConfig(
        model=ModelConfig(profile=args.profile, pool_pages=POOL_PAGES, max_requests=MAX_REQUESTS),
        transfer=TransferConfig(
            backend=args.backend,
            timeout_seconds=30,
            heartbeat_interval_seconds=0.5,
            device=args.device,
            nixl=NixlConfig(ucx_tls=args.ucx_tls),
        ),
        synthetic=SyntheticConfig(
            requests_per_second=0, requests=args.requests, tokens=args.tokens, max_inflight=args.inflight
        ),
    )


def run(args: argparse.Namespace) -> int:
    from ..agent.launch import AgentProcess, loopback_pair

    if args.backend == "cuda-ipc" and args.device != "cuda":
        print("pdpair-agent demo: --backend cuda-ipc moves GPU memory: add --device cuda", file=sys.stderr)
        return 2

    if args.sidecar:
        from ..localapi.demo import run_sidecar_demo

        return run_sidecar_demo(demo_config(args), as_json=args.json, timeout=args.timeout, hold=args.hold)

    prefill_cfgs, decode_cfgs = loopback_pair(
        demo_config(args), prefill_tp=args.prefill_tp, decode_tp=args.decode_tp
    )
    with tempfile.TemporaryDirectory(prefix="pdpair-demo-") as tmp:
        work = Path(tmp)
        prefill = [AgentProcess(c, work, f"prefill-{c.tp_rank}", one_rank=True) for c in prefill_cfgs]
        decode = [AgentProcess(c, work, f"decode-{c.tp_rank}", one_rank=True) for c in decode_cfgs]
        try:
            for agent in prefill + decode:
                agent.wait_ready()
            finished = follow(decode, args.requests * len(decode), args.timeout)
            statuses = [a.status() for a in decode]
            rows = component_rows([a.status() for a in prefill], statuses)
            requests = [s["requests"] for s in statuses]
            window = max(s.get("transfer_window_seconds", 0.0) for s in statuses)
            report(args, rows, requests, prefill + decode, finished, window)
            if args.hold > 0:
                time.sleep(args.hold)
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
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    agents: list[Any],
    finished: bool,
    window: float = 0.0,
) -> None:
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    made = sum(r["made"] for r in requests)
    ok = sum(r["succeeded"] for r in requests)
    print(
        f"\nPDPair demo: profile {args.profile}, prefill TP {args.prefill_tp} -> decode TP {args.decode_tp}, "
        f"{TRANSPORTS[args.backend]}; {ok}/{made} requests succeeded"
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
