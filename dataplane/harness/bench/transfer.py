"""``bench transfer``: the agent's end-to-end state send vs raw NIXL (no agent) writing the same blocks
vs a plain memcpy of the same bytes, side by side in one run, on identical NIXL/UCX settings.

Per case (a block size, or a model profile's request mix) and per repetition (agent and raw take turns
going first, so drift in the machine's load hits both alike):

- agent: a prefill and a decode agent as two processes (``pdpair-agent run``, verification off),
  ``maxInflight`` rooms in flight; ``warmup`` + ``requests`` rooms, the warm-up rooms left out of decode's
  statistics (``synthetic.warmup``). Latency per request = the median room time on decode (metadata
  sent → Success received); throughput = bytes over decode's transfer window (first counted metadata
  sent → last Success);
- raw NIXL: this process writes the identical ``WritePlan`` of every request, cut exactly as the
  agent cuts it into engine requests (``transfer_requests``), through the bare
  ``NixlTransport.write`` + ``wait`` (posting in line: no ``postThread``, which is the agent's) to a
  second process that only registered the decode layout,
  with up to ``maxInflight`` requests outstanding; the ``warmup`` first requests untimed, then each
  request timed from post to seen complete (median) and the whole loop (throughput); and once more
  with NIXL's own backend thread copying every request (``raw_engine_threaded_gbps``, ``numThreads``
  1): on a 16-core host that setting moved 1 MiB blocks ~40% faster than posting in line, so the
  agent is measured against both;
- memcpy: numpy copies of the same blocks in this process (the machine's limit).

Each figure is the median over the repetitions. ``overhead_us`` = agent median latency minus raw median
latency per request: what the agent's control path (two control hops, planning, accounting) adds.
``prefill_cpu_us`` / ``prefill_worker_cpu_us``: CPU µs per room the prefill agent spent (its process /
its role-worker thread, from ``/proc``, warm-up rooms included) — with rooms in flight the worker's
figure is the agent's throughput limit, whatever else the machine was doing;
``decode_worker_cpu_us``: the same for decode's role worker (which side bounds small rooms).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ... import planner
from ...agent.pools import MemoryPools
from ...agent.requests import transfer_requests
from ...agent.synthetic import items_for_tokens
from ...errors import PDPairError
from ...schema.profiles import schema_from_config
from ...transports.nixl import NixlTransport, load_sdk, ucx_environment
from ..agent_processes import run_pair


def as_role(cfg: Any, role: str) -> Any:
    return msgspec.structs.replace(cfg, role=role)


def with_requests(cfg: Any, requests: int, warmup: int = 0) -> Any:
    syn = msgspec.structs.replace(cfg.synthetic, requests=requests, warmup=warmup)
    return msgspec.structs.replace(cfg, synthetic=syn)


def with_nixl_threads(cfg: Any) -> Any:
    """``cfg`` with NIXL's own backend thread copying every request (``NixlConfig.numThreads`` 1):
    raw NIXL's fastest setting for rooms of large blocks on the hosts measured, reported
    beside raw NIXL on the agent's own setting. ``cfg`` itself when it already has threads."""
    nixl = cfg.transfer.nixl
    if nixl.num_threads > 0:
        return cfg
    tr = msgspec.structs.replace(cfg.transfer, nixl=msgspec.structs.replace(nixl, num_threads=1))
    return msgspec.structs.replace(cfg, transfer=tr)


def tokens_of(cfg: Any, n: int) -> list[int]:
    toks = cfg.synthetic.tokens
    return [toks[i % len(toks)] for i in range(n)]


def plan_for(schema: Any, layout: Any, decode_schema: Any, tokens: int, slot: int = 0) -> Any:
    """The plan the agent makes for this request when it holds the ``slot``-th set of items: rooms in
    flight hold distinct items, so raw NIXL cycles through as many sets as the agent has rooms in
    flight and touches as much memory (one set for all requests would keep raw NIXL's pages hot
    in cache and free of first-touch faults that the agent pays)."""
    c = items_for_tokens(decode_schema, tokens)
    kv = np.arange(c.kv, dtype=np.int32) + slot * c.kv
    state = [np.arange(n, dtype=np.int32) + slot * n for n in c.state]
    aux = slot if c.aux else None
    return planner.plan_request(schema, layout, planner.RequestIndices(kv, kv, aux, aux, state, state))


def run_case(label: str, cfg: Any, *, repeat: int, warmup: int) -> dict[str, Any]:
    n, depth = cfg.synthetic.requests, cfg.synthetic.max_inflight
    prefill_schema = schema_from_config(cfg)
    decode_schema = schema_from_config(as_role(cfg, "decode"))
    layout = planner.PeerLayout.from_schema(decode_schema)
    sizes = tokens_of(cfg, warmup + n)
    plans = [plan_for(prefill_schema, layout, decode_schema, t, i % depth) for i, t in enumerate(sizes)]
    threaded = with_nixl_threads(cfg)
    agents, raws, threads, copies, loads = [], [], [], [], []
    for rep in range(repeat):
        loads.append(os.getloadavg()[0])
        first_agent = rep % 2 == 0
        if first_agent:
            agents.append(agent_run(with_requests(cfg, warmup + n, warmup)))
        raws.append(raw_run(cfg, plans, warmup, depth))
        threads.append(raw_run(threaded, plans, warmup, depth) if threaded is not cfg else raws[-1])
        if not first_agent:
            agents.append(agent_run(with_requests(cfg, warmup + n, warmup)))
        copies.append(memcpy_run(prefill_schema, decode_schema, plans[warmup:]))
    med = statistics.median
    agent = {k: med(a[k] for a in agents) for k in agents[0]}
    raw = {k: med(r[k] for r in raws) for k in raws[0]}
    raw_threaded = med(r["gbps"] for r in threads)
    per_request = sum(p.total_bytes for p in plans[warmup:]) / max(1, n)
    return {
        "case": label,
        "requests": n,
        "warmup": warmup,
        "repeat": repeat,
        "bytes_per_request": sum(p.total_bytes for p in plans[warmup:]) // max(1, n),
        "agent_gbps": round(agent["gbps"], 4),
        "raw_engine_gbps": round(raw["gbps"], 4),
        "memcpy_gbps": round(med(copies), 4),
        "ratio_agent_vs_raw": round(agent["gbps"] / raw["gbps"], 4) if raw["gbps"] else None,
        "raw_engine_threaded_gbps": round(raw_threaded, 4),
        "ratio_agent_vs_raw_threaded": round(agent["gbps"] / raw_threaded, 4) if raw_threaded else None,
        "agent_p50_us": round(agent["p50_us"], 1),
        "raw_p50_us": round(raw["p50_us"], 1),
        "overhead_us": round(agent["p50_us"] - raw["p50_us"], 1),
        "inflight": depth,
        "amortised_overhead_us": _amortised(per_request, agent["gbps"], raw["gbps"]),
        "ratio_runs": _ratios(agents, raws),
        "ratio_threaded_runs": _ratios(agents, threads),
        "overhead_runs_us": [round(a["p50_us"] - r["p50_us"], 1) for a, r in zip(agents, raws, strict=True)],
        "load_1m": [round(x, 2) for x in loads],
        "prefill_cpu_us": _rounded(agent["prefill_cpu_us"]),
        "prefill_worker_cpu_us": _rounded(agent["prefill_worker_cpu_us"]),
        "decode_worker_cpu_us": _rounded(agent["decode_worker_cpu_us"]),
    }


def _ratios(agents: list[dict[str, float]], engines: list[dict[str, float]]) -> list[float]:
    return [round(a["gbps"] / e["gbps"], 3) for a, e in zip(agents, engines, strict=True)]


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 1)


def _amortised(nbytes: float, agent_gbps: float, raw_gbps: float) -> float | None:
    """Wall time per request the agent adds at its throughput (what ``inflight`` rooms in flight
    hide of the latency shows here): bytes per request over each rate, subtracted."""
    if not agent_gbps or not raw_gbps:
        return None
    return round((nbytes / agent_gbps - nbytes / raw_gbps) / 1e3, 1)


def agent_run(cfg: Any, tries: int = 3) -> dict[str, float]:
    """One agent pair run; a pair that fails to start (its free port taken meanwhile by another
    process on a busy machine) is started again on fresh ports."""
    for attempt in range(tries):
        try:
            return _agent_pair(cfg)
        except PDPairError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _agent_pair(cfg: Any) -> dict[str, float]:
    st = run_pair(cfg, prefix="pdpair-bench-")
    total = sum(c["bytes"] for c in st["components"].values())
    window = st["transfer_window_seconds"]
    p50 = st["components"]["kv"]["p50_ms"] * 1e3
    rooms = max(1, cfg.synthetic.requests)
    cpu = {k: (v if v is not None else math.nan) / rooms * 1e6 for k, v in st["prefill_cpu"].items()}
    dcpu = {k: (v if v is not None else math.nan) / rooms * 1e6 for k, v in st["decode_cpu"].items()}
    return {
        "gbps": total / window / 1e9 if window else 0.0, "p50_us": p50,
        "prefill_cpu_us": cpu["process_seconds"], "prefill_worker_cpu_us": cpu["worker_seconds"],
        "decode_worker_cpu_us": dcpu["worker_seconds"],
    }


def _quiet_nixl() -> None:
    """NIXL logs INFO lines to stdout, which ``--json`` keeps for the results."""
    load_sdk()
    logging.getLogger("nixl").setLevel(logging.WARNING)


def _target(cfg: Any, conn: Any) -> None:
    """Raw NIXL's passive side: register the decode layout, hand out its blobs, wait."""
    _quiet_nixl()
    os.environ.update(ucx_environment(cfg.transfer.nixl))  # this process starts here
    pools = MemoryPools.allocate(schema_from_config(as_role(cfg, "decode")), prefault=True)
    transport = NixlTransport("bench-raw-target", cfg.transfer.nixl.for_role("decode"))
    blobs = transport.register(pools.memory_regions())
    conn.send((transport.endpoint(), blobs))
    conn.recv()
    transport.close()


def raw_run(cfg: Any, plans: list[Any], warmup: int, depth: int = 1) -> dict[str, float]:
    _quiet_nixl()
    os.environ.update(ucx_environment(cfg.transfer.nixl))  # the benchmark's own process, as an agent's
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_target, args=(cfg, there), daemon=True)
    child.start()
    try:
        endpoint, blobs = here.recv()
        pools = MemoryPools.allocate(schema_from_config(cfg), prefault=True)
        bare = msgspec.structs.replace(cfg.transfer.nixl.for_role("prefill"), post_thread=False)
        with NixlTransport("bench-raw-initiator", bare) as transport:
            transport.register(pools.memory_regions())
            peer = transport.connect("target", endpoint, blobs)
            parts = [[w for _, w in transfer_requests(plan)] for plan in plans]
            _pipeline(transport, peer, parts[:warmup], depth)
            start = time.perf_counter()
            times = _pipeline(transport, peer, parts[warmup:], depth)
            elapsed = time.perf_counter() - start
        here.send("stop")
    finally:
        child.join(10)
    total = sum(p.total_bytes for p in plans[warmup:])
    return {"gbps": total / elapsed / 1e9, "p50_us": statistics.median(times) * 1e6}


def _pipeline(transport: Any, peer: Any, requests: list[list[Any]], depth: int) -> list[float]:
    """Post each request's engine requests (the agent's own grouping, ``transfer_requests``) with up to
    ``depth`` requests outstanding, as the agent keeps ``maxInflight`` rooms; returns each request's
    time from post to seen complete."""
    deadline = time.monotonic() + 60
    outstanding: collections.deque[tuple[float, list[Any]]] = collections.deque()
    times = []
    for writes in requests:
        while len(outstanding) >= depth:
            times.append(_finish(transport, outstanding.popleft(), deadline))
        outstanding.append((time.perf_counter(), [transport.write(peer, w) for w in writes]))
    while outstanding:
        times.append(_finish(transport, outstanding.popleft(), deadline))
    return times


def _finish(transport: Any, posted: tuple[float, list[Any]], deadline: float) -> float:
    start, transfers = posted
    for transfer in transfers:
        transport.wait(transfer, deadline)
    return time.perf_counter() - start


def memcpy_run(src_schema: Any, dst_schema: Any, plans: list[Any]) -> float:
    """numpy copies of exactly the planned blocks, between two host pools in this process."""
    src = MemoryPools.allocate(src_schema, prefault=True)
    dst = MemoryPools.allocate(dst_schema, prefault=True)
    fields = ("local_region", "local_offset", "remote_region", "remote_offset", "size")
    rows = [list(zip(*(getattr(p, f).tolist() for f in fields), strict=True)) for p in plans]
    start = time.perf_counter()
    for blocks in rows:
        for lr, lo, rr, ro, n in blocks:
            dst.buffers[rr][ro : ro + n] = src.buffers[lr][lo : lo + n]
    elapsed = time.perf_counter() - start
    return sum(p.total_bytes for p in plans) / elapsed / 1e9


__all__ = ["agent_run", "memcpy_run", "raw_run", "run_case"]


def run_cases(
    cases: list[tuple[str, Any]], *, repeat: int, warmup: int, lanes: bool = True, spin_us: int = 0,
    coalesce_bytes: int | None = None, compiled: bool = False,
) -> list[dict[str, Any]]:
    """``run_case`` per case, with the agents' lanes, spin and coalescing settings applied."""
    results = []
    for label, cfg in cases:
        if not lanes:
            cfg = msgspec.structs.replace(cfg, listen=msgspec.structs.replace(cfg.listen, lanes=False))
        if spin_us:
            tr = msgspec.structs.replace(cfg.transfer, spin_microseconds=spin_us)
            cfg = msgspec.structs.replace(cfg, transfer=tr)
        if coalesce_bytes is not None:
            tr = msgspec.structs.replace(cfg.transfer, coalesce_bytes=coalesce_bytes)
            cfg = msgspec.structs.replace(cfg, transfer=tr)
        print(f"bench: {label} ...", file=sys.stderr, flush=True)
        results.append({**run_case(label, cfg, repeat=repeat, warmup=warmup), "compiled": compiled})
    return results


COLUMNS = (
    ("case", "case", "<16", ""), ("requests", "requests", ">8", ""),
    ("agent GB/s", "agent_gbps", ">10", ".3f"),
    ("raw GB/s", "raw_engine_gbps", ">9", ".3f"), ("memcpy GB/s", "memcpy_gbps", ">11", ".3f"),
    ("agent/raw", "ratio_agent_vs_raw", ">9", ".3f"),
    ("raw threaded GB/s", "raw_engine_threaded_gbps", ">17", ".3f"),
    ("agent/threaded", "ratio_agent_vs_raw_threaded", ">14", ".3f"),
    ("agent p50 us", "agent_p50_us", ">12", ".1f"),
    ("raw p50 us", "raw_p50_us", ">10", ".1f"), ("overhead us", "overhead_us", ">11", ".1f"),
    ("amortised us", "amortised_overhead_us", ">12", ".1f"),
    ("prefill worker CPU us", "prefill_worker_cpu_us", ">21", ".1f"),
    ("decode worker CPU us", "decode_worker_cpu_us", ">20", ".1f"),
)


def table(results: list[dict[str, Any]]) -> str:
    head = " ".join(f"{title:{align}}" for title, _, align, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            " ".join(
                f"{r[key]:{align}{fmt}}" if r.get(key) is not None else f"{'-':{align}}"
                for _, key, align, fmt in COLUMNS
            )
        )
    return "\n".join(lines)


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}, "
        f"Python {platform.python_version()}; load average at the end {load}; "
        f"UCX_TLS={os.environ.get('UCX_TLS', '(UCX default)')}"
    )


def record(path: Path, results: list[dict[str, Any]], command: str) -> None:
    """The run as one Markdown report (date, machine, command, table, JSON), replacing ``path``: a
    record of this run, not a log of all of them (docs/benchmarks.md keeps the current figures)."""
    path.write_text(
        f"# bench transfer, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n\n- machine: {machine()}\n"
        f"- command: `{command}`\n\n```\n{table(results)}\n```\n\n"
        f"```json\n{json.dumps(results, indent=1)}\n```\n"
    )
