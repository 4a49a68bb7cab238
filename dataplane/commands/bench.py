"""``pdpair-agent bench transfer``: the agent's end-to-end state send vs the raw NIXL engine writing the
same blocks vs a plain memcpy of the same bytes, side by side in one run.

Per case (a block size, or a model profile's request mix), on the same block lists:

- agent: a prefill and a decode agent as two processes (``pdpair-agent run``, verification off), one
  room in flight at a time; GB/s = bytes over decode's transfer window (first metadata sent → last
  Success received), so it includes planning, control messages and completion;
- raw engine: this process writes the identical ``WritePlan`` of every request through the bare
  ``NixlTransport.write`` + ``wait`` to a second process that only registered the decode layout;
- memcpy: numpy copies of the same blocks in this process (the machine's limit).

Block-size cases use a KV-only model whose page is the block (each request = one page of K and one of
V); ``overhead_us`` is the agent's time per request minus the raw engine's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SIZES = "4K,64K,1M,4M,16M,64M"
CASE_BYTES = 256 << 20


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="benchmarks that write JSON results")
    sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    _add_codec(sub)
    t = sub.add_parser(
        "transfer",
        help="agent vs raw NIXL vs memcpy on the same blocks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("--sizes", default=SIZES, help=f"block sizes (default: {SIZES})")
    t.add_argument("--mix", default="qwen3-next", help="model profile for the request-mix case ('' = none)")
    t.add_argument("--case-bytes", type=int, default=CASE_BYTES, help="bytes moved per case")
    t.add_argument("--max-requests", type=int, default=400, help="cap on requests per case")
    t.add_argument("--json", action="store_true", help="print a JSON list of cases")
    t.add_argument("--record", metavar="FILE", help="append the results as a dated section to FILE")
    t.set_defaults(handler=run)


def _add_codec(sub: Any) -> None:
    """``bench codec``: our codec + planner vs sglang 0.5.23's own helpers (``dataplane.bench.codec``)."""
    c = sub.add_parser(
        "codec",
        help="codec + planner vs sglang 0.5.23's own helpers, same inputs, one run",
        description="Times our wire codec and transfer planner against sglang's helper functions "
        "(fetched with pip download at run time) on a Qwen3-Next-like 32K-token request.",
    )
    c.add_argument("--json", action="store_true", help="print a JSON list, one object per scenario")
    c.add_argument("--iterations", type=int, default=2000, help="calls per timed batch (best of 3)")
    c.add_argument("--cache-dir", type=Path, default=None, help="where the sglang wheel is cached")
    c.set_defaults(handler=_codec)


def _codec(args: argparse.Namespace) -> int:
    from ..bench import codec, sglang_ref

    cache = args.cache_dir or sglang_ref.DEFAULT_CACHE
    print(codec.render(codec.run(iterations=args.iterations, cache_dir=cache), args.json))
    return 0


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def block_config(block: int, requests: int) -> Any:
    from ..config import AgentConfig, ModelConfig, SyntheticConfig, TransferConfig

    pages = max(2, min(16, (64 << 20) // block))
    return AgentConfig(
        model=ModelConfig(
            name=f"block-{block}",
            profile=None,
            kv_item_len=block,
            kv_layers=1,
            page_size=16,
            pool_pages=pages,
            max_requests=8,
        ),
        transfer=TransferConfig(timeout_seconds=60, heartbeat_interval_seconds=0.5),
        synthetic=SyntheticConfig(
            requests_per_second=0, requests=requests, tokens=(16,), max_inflight=1, verify=False
        ),
    )


def mix_config(profile: str, requests: int) -> Any:
    from ..config import AgentConfig, ModelConfig, SyntheticConfig, TransferConfig

    return AgentConfig(
        model=ModelConfig(profile=profile, pool_pages=512, max_requests=16),
        transfer=TransferConfig(timeout_seconds=60, heartbeat_interval_seconds=0.5),
        synthetic=SyntheticConfig(
            requests_per_second=0,
            requests=requests,
            tokens=(1024, 4096, 300, 2048),
            max_inflight=1,
            verify=False,
        ),
    )


def run(args: argparse.Namespace) -> int:
    cases = []
    for size in (parse_size(s) for s in args.sizes.split(",") if s.strip()):
        requests = max(20, min(args.max_requests, args.case_bytes // (2 * size)))
        cases.append((_label(size), block_config(size, requests)))
    if args.mix:
        cases.append((f"mix:{args.mix}", mix_config(args.mix, min(args.max_requests, 200))))
    results = []
    for label, cfg in cases:
        print(f"bench: {label} ...", file=sys.stderr, flush=True)
        results.append(run_case(label, cfg))
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(table(results))
    if args.record:
        record(Path(args.record), results, " ".join(["pdpair-agent", *sys.argv[1:]]))
    return 0


def _label(size: int) -> str:
    return f"{size >> 20}MiB" if size >= 1 << 20 else f"{size >> 10}KiB"


def run_case(label: str, cfg: Any) -> dict[str, Any]:
    from .. import planner
    from ..schema.profiles import schema_from_config

    prefill_schema = schema_from_config(cfg)
    decode_schema = schema_from_config(_as_role(cfg, "decode"))
    layout = planner.PeerLayout.from_schema(decode_schema)
    plans = [_plan(prefill_schema, layout, decode_schema, t) for t in _tokens(cfg)]
    agent = agent_run(cfg)
    raw = raw_run(cfg, plans)
    memcpy = memcpy_run(prefill_schema, decode_schema, plans)
    return {
        "case": label,
        "requests": cfg.synthetic.requests,
        "bytes": agent["bytes"],
        "agent_gbps": round(agent["gbps"], 4),
        "raw_engine_gbps": round(raw["gbps"], 4),
        "memcpy_gbps": round(memcpy, 4),
        "ratio_agent_vs_raw": round(agent["gbps"] / raw["gbps"], 4),
        "agent_us_per_request": round(agent["us"], 1),
        "raw_us_per_request": round(raw["us"], 1),
        "overhead_us": round(agent["us"] - raw["us"], 1),
    }


def _as_role(cfg: Any, role: str) -> Any:
    import msgspec

    return msgspec.structs.replace(cfg, role=role)


def _tokens(cfg: Any) -> list[int]:
    toks = cfg.synthetic.tokens
    return [toks[i % len(toks)] for i in range(cfg.synthetic.requests)]


def _plan(schema: Any, layout: Any, decode_schema: Any, tokens: int) -> Any:
    """The plan the agent makes for this request with one room in flight (items from index 0)."""
    import numpy as np

    from .. import planner
    from ..agent.synthetic import items_for_tokens

    c = items_for_tokens(decode_schema, tokens)
    kv = np.arange(c.kv, dtype=np.int32)
    state = [np.arange(n, dtype=np.int32) for n in c.state]
    aux = 0 if c.aux else None
    req = planner.RequestIndices(kv, kv, aux, aux, state, state)
    return planner.plan_request(schema, layout, req)


def agent_run(cfg: Any) -> dict[str, float]:
    from ..agent.launch import AgentProcess, loopback_pair

    (p_cfg,), (d_cfg,) = loopback_pair(cfg)
    with tempfile.TemporaryDirectory(prefix="pdpair-bench-") as tmp:
        prefill = AgentProcess(p_cfg, Path(tmp), "prefill")
        decode = AgentProcess(d_cfg, Path(tmp), "decode")
        try:
            prefill.wait_ready()
            decode.wait_ready()
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                st = decode.status()
                if st["requests"]["completed"] >= cfg.synthetic.requests:
                    break
                time.sleep(0.1)
            st = decode.status()
        finally:
            decode.stop()
            prefill.stop()
    total = sum(c["bytes"] for c in st["components"].values())
    window = st["transfer_window_seconds"]
    n = max(1, st["requests"]["succeeded"])
    return {"bytes": total, "gbps": total / window / 1e9 if window else 0.0, "us": window / n * 1e6}


def _target(cfg: Any, conn: Any) -> None:
    """The raw engine's passive side: register the decode layout, hand out its blobs, wait."""
    from ..agent.pools import MemoryPools
    from ..schema.profiles import schema_from_config
    from ..transports.nixl import NixlTransport

    pools = MemoryPools.allocate(schema_from_config(_as_role(cfg, "decode")))
    transport = NixlTransport("bench-raw-target", cfg.transfer.nixl)
    blobs = transport.register(pools.memory_regions())
    conn.send((transport.endpoint(), blobs))
    conn.recv()
    transport.close()


def raw_run(cfg: Any, plans: list[Any]) -> dict[str, float]:
    from ..agent.pools import MemoryPools
    from ..schema.profiles import schema_from_config
    from ..transports.nixl import NixlTransport

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_target, args=(cfg, there), daemon=True)
    child.start()
    try:
        endpoint, blobs = here.recv()
        pools = MemoryPools.allocate(schema_from_config(cfg))
        with NixlTransport("bench-raw-initiator", cfg.transfer.nixl) as transport:
            transport.register(pools.memory_regions())
            peer = transport.connect("target", endpoint, blobs)
            transport.wait(transport.write(peer, plans[0]), time.monotonic() + 30)
            start = time.perf_counter()
            for plan in plans:
                transport.wait(transport.write(peer, plan), time.monotonic() + 30)
            elapsed = time.perf_counter() - start
        here.send("stop")
    finally:
        child.join(10)
    total = sum(p.total_bytes for p in plans)
    return {"gbps": total / elapsed / 1e9, "us": elapsed / len(plans) * 1e6}


def memcpy_run(src_schema: Any, dst_schema: Any, plans: list[Any]) -> float:
    """numpy copies of exactly the planned blocks, between two host pools in this process."""
    from ..agent.pools import MemoryPools

    src, dst = MemoryPools.allocate(src_schema), MemoryPools.allocate(dst_schema)
    rows = [
        list(
            zip(
                *(
                    getattr(p, f).tolist()
                    for f in ("local_region", "local_offset", "remote_region", "remote_offset", "size")
                ),
                strict=True,
            )
        )
        for p in plans
    ]
    start = time.perf_counter()
    for blocks in rows:
        for lr, lo, rr, ro, n in blocks:
            dst.buffers[rr][ro : ro + n] = src.buffers[lr][lo : lo + n]
    elapsed = time.perf_counter() - start
    return sum(p.total_bytes for p in plans) / elapsed / 1e9


def table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'case':<16} {'requests':>8} {'agent GB/s':>10} {'raw GB/s':>9} {'memcpy GB/s':>11} "
        f"{'agent/raw':>9} {'agent us/req':>12} {'raw us/req':>10} {'overhead us':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r['case']:<16} {r['requests']:>8} {r['agent_gbps']:>10.3f} {r['raw_engine_gbps']:>9.3f} "
            f"{r['memcpy_gbps']:>11.3f} {r['ratio_agent_vs_raw']:>9.3f} {r['agent_us_per_request']:>12.1f} "
            f"{r['raw_us_per_request']:>10.1f} {r['overhead_us']:>11.1f}"
        )
    return "\n".join(lines)


def record(path: Path, results: list[dict[str, Any]], command: str) -> None:
    """Append a dated section (machine, command, table, JSON) under the "transfer" heading."""
    import os

    machine = (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}, "
        f"Python {platform.python_version()}"
    )
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if "\n## transfer\n" not in text:
        text += "\n## transfer\n"
    text += (
        f"\n### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n\n- machine: {machine}\n- command: `{command}`\n\n"
        f"```\n{table(results)}\n```\n\n<details><summary>JSON</summary>\n\n```json\n"
        f"{json.dumps(results, indent=1)}\n```\n</details>\n"
    )
    path.write_text(text)
