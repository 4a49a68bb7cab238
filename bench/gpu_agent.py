"""The real agents on CUDA pools, direct vs staged: the "agent" column of docs/gpu.md.

Per case and path, a prefill and a decode agent (``pdpair-agent run``, two processes on one GPU,
NIXL VRAM on loopback) move ``--requests`` synthetic requests one at a time, and decode verifies every
byte of every component (any mismatch fails the run). Paths: ``direct`` (``transfer.staged.mode:
off``), ``auto`` (staged when a component's mean write is under 512 KiB), ``staged`` (every
component staged) and ``ipc`` (``transfer.backend: cuda-ipc``: no engine, one copy kernel per room).
The figure per request is prefill's own: from the start of a component's writes
to their completion (staged: to decode's last acknowledgement, after its scatter), the median per
component, the slowest component taken; GB/s = request bytes over that. One room is in flight, so
decode's verification never overlaps a timed room. With ``--inflight N`` (N > 1) rooms overlap, and
the figure is decode's bytes over its transfer window instead (``--no-verify`` then measures the
transfer path without the synthetic engine's host copies). ``d2d`` is a torch copy of the same byte count in
this process.

Cases are explicit KV layouts (``model.profile: null``): one 64-token page per KV buffer per request,
so a request is one write per buffer, in separate regions (the synthetic engine hands out consecutive
pages, which the planner would merge: many buffers are how the agent gets many small writes).
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

from dataplane.config import (  # noqa: E402
    AgentConfig,
    ModelConfig,
    StagedConfig,
    SyntheticConfig,
    TransferConfig,
)
from dataplane.harness.agent_processes import AgentProcess, loopback_pair  # noqa: E402

CASES = {
    # name: (KV page bytes, KV layers (buffers = 2 x layers), pool pages)
    "4KiB x 4096": (4 << 10, 2048, 4),
    "64KiB x 1024": (64 << 10, 512, 4),
    "1MiB x 256": (1 << 20, 128, 4),
    "64MiB x 16": (64 << 20, 8, 2),
}
PATHS = {
    "direct": ("off", 512 << 10, 1, "nixl"),
    "auto": ("on", 512 << 10, 256, "nixl"),
    "staged": ("on", 1 << 50, 1, "nixl"),
    "ipc": ("off", 512 << 10, 1, "cuda-ipc"),
}
"""path: (staged mode, threshold bytes, min writes, backend); ``auto`` is NIXL's default policy,
``ipc`` the ``cuda-ipc`` transport (one copy kernel per room, page to page)."""


def config(
    case: str, path: str, *, requests: int, slot_mib: int, slots: int, kernel: str, device: str = "cuda",
    verify: bool = True, inflight: int = 1,
) -> AgentConfig:
    page, layers, pool = CASES[case]
    pool = max(pool, inflight + 1)
    mode, threshold, min_writes, backend = PATHS[path]
    staged = StagedConfig(
        mode=mode,  # type: ignore[arg-type]
        threshold_bytes=threshold,
        min_writes=min_writes,
        slot_bytes=slot_mib << 20,
        slots=slots,
        kernel=kernel,  # type: ignore[arg-type]
    )
    return AgentConfig(
        model=ModelConfig(
            profile=None, kv_item_len=page, kv_layers=layers, pool_pages=pool,
            max_requests=max(4, inflight + 1), page_size=64,
        ),
        transfer=TransferConfig(
            backend=backend,  # type: ignore[arg-type]
            timeout_seconds=60,
            heartbeat_interval_seconds=1.0,
            device=device,  # type: ignore[arg-type]
            staged=staged,
        ),
        synthetic=SyntheticConfig(
            requests_per_second=0, requests=requests, tokens=(64,), max_inflight=inflight, verify=verify,
            warmup=5 if inflight > 1 else 0,
        ),
    )


def run(cfg: AgentConfig, timeout: float) -> dict[str, Any]:
    (p_cfg,), (d_cfg,) = loopback_pair(cfg)
    with tempfile.TemporaryDirectory(prefix="pdpair-gpu-agent-") as tmp:
        prefill = AgentProcess(p_cfg, Path(tmp), "prefill")
        decode = AgentProcess(d_cfg, Path(tmp), "decode")
        try:
            prefill.wait_ready(120)
            decode.wait_ready(120)
            deadline, want = time.monotonic() + timeout, cfg.synthetic.requests
            while time.monotonic() < deadline and decode.status()["requests"]["completed"] < want:
                time.sleep(0.1)
            return {"prefill": prefill.status(), "decode": decode.status(), "log": decode.log_tail(5)}
        finally:
            decode.stop()
            prefill.stop()


def d2d_gbps(nbytes: int, device: str) -> float:
    """A device-to-device copy of ``nbytes`` (numpy memcpy for a host-memory smoke run)."""
    if device != "cuda":
        import numpy as np

        a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        t = time.perf_counter()
        np.copyto(b, a)
        return nbytes / (time.perf_counter() - t) / 1e9
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / statistics.median(times[2:]) / 1e9


def measure(case: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    cfg = config(
        case,
        path,
        requests=args.requests,
        slot_mib=args.slot_mib,
        slots=args.slots,
        kernel=args.kernel,
        device=args.device,
        verify=not args.no_verify,
        inflight=args.inflight,
    )
    out = run(cfg, args.timeout)
    req = out["decode"]["requests"]
    comps = out["prefill"]["components"]
    per_request = sum(c["bytes"] for c in comps.values()) / max(1, req["succeeded"])
    slowest = max((c["p50_ms"] or 0.0) for c in comps.values()) if comps else 0.0
    post = max((c.get("post_p50_ms") or 0.0) for c in comps.values()) if comps else 0.0
    verified = req["succeeded"] == args.requests and req["verification_failures"] == 0 and not args.no_verify
    verified = verified and all(
        c["verified_bytes"] == c["bytes"] and c["mismatched_bytes"] == 0
        for c in out["decode"]["components"].values()
    )
    window = out["decode"].get("transfer_window_seconds") or 0.0
    moved = sum(c["bytes"] for c in out["decode"]["components"].values())
    if args.inflight > 1:  # rooms overlap: throughput over decode's window, not one room's latency
        gbps = moved / window / 1e9 if window else 0.0
    else:
        gbps = per_request / (slowest / 1e3) / 1e9 if slowest else 0.0
    row = {
        "case": case,
        "path": path,
        "inflight": args.inflight,
        "bytes_per_request": per_request,
        "p50_ms": slowest,
        "post_p50_ms": post,
        "gbps": gbps,
        "requests": req,
        "verified": verified,
        "staged": out["prefill"].get("staged"),
    }
    print(
        f"  {case:14s} {path:7s} {row['gbps']:8.1f} GB/s  p50 {slowest:8.3f} ms  (write returned at "
        f"{post:.3f} ms)  verified={verified}",
        flush=True,
    )
    if not verified:
        print(out["log"], flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument(
        "--inflight",
        type=int,
        default=1,
        help="rooms in flight; above 1 the figure is decode's bytes over its transfer window (after 5 "
        "warm-up rooms), not one room's latency",
    )
    ap.add_argument("--slot-mib", type=int, default=64)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--kernel", default="torch", choices=("torch", "triton"))
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke run in host memory"
    )
    ap.add_argument(
        "--no-verify",
        action="store_true",
        help="no synthetic fill on prefill and no check on decode: the transfer path alone (rows read "
        "verified=NO, as nothing was checked)",
    )
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = []
    for case in args.cases.split(","):
        for path in args.paths.split(","):
            rows.append(measure(case, path, args))
    d2d = {
        case: d2d_gbps(int(next(r for r in rows if r["case"] == case)["bytes_per_request"]), args.device)
        for case in CASES
        if any(r["case"] == case for r in rows)
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "d2d": d2d}, indent=1))
    paths = args.paths.split(",")
    head = f"{'case':14s} {'MiB':>6s} {'d2d':>7s} " + " ".join(f"{p:>16s}" for p in paths) + "  verified"
    print(head)
    print("-" * len(head))
    for case in d2d:
        cells = {r["path"]: r for r in rows if r["case"] == case}
        mib = next(iter(cells.values()))["bytes_per_request"] / 2**20
        text = " ".join(
            f"{cells[p]['gbps']:7.1f} ({cells[p]['gbps'] / d2d[case] * 100:4.1f}%)"
            if p in cells
            else " " * 16
            for p in paths
        )
        ok = all(c["verified"] for c in cells.values())
        print(f"{case:14s} {mib:6.1f} {d2d[case]:7.0f} {text}  {'yes' if ok else 'NO'}")
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
