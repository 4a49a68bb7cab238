"""``bench transfer``: the agent's end-to-end state send vs raw NIXL (no agent) writing the same blocks
vs a plain memcpy of the same bytes, side by side in one run, on identical NIXL/UCX settings.

A case is a block size, a model profile's request mix (equal TP), or a TP-mismatched room: the mix
between a prefill pod of TP P and a decode pod of TP D (one agent process per pod serving each of its
ranks; each prefill rank writes its slice to the decode ranks sglang's rules pair it with, compact
strided plans where heads or Mamba state split). Per case and per repetition (agent and raw take
turns going first, so drift in the machine's load hits both alike):

- agent: a prefill and a decode agent as two processes (``pdpair-agent run``, verification off),
  ``maxInflight`` rooms in flight; ``warmup`` + ``requests`` rooms, the warm-up rooms left out of decode's
  statistics (``synthetic.warmup``). Latency per request = the median room time on decode (metadata
  sent → Success received); throughput = bytes over decode's transfer window (first counted metadata
  sent → last Success);
- raw NIXL: this process writes the identical ``WritePlan`` of every request (of every rank pair),
  cut exactly as the agent cuts it into engine requests (``transfer_requests``), through the bare
  ``NixlTransport.write`` + ``wait`` (posting in line: no ``postThread``, which is the agent's) to a
  second process that only registered the decode layout (every decode rank's regions in one NIXL
  agent; this process registers every prefill rank's in one),
  with up to ``maxInflight`` requests outstanding; the ``warmup`` first requests untimed, then each
  request timed from post to seen complete (median) and the whole loop (throughput); and once more
  with NIXL's own backend thread copying every request (``raw_engine_threaded_gbps``, ``numThreads``
  1): on a 16-core host that setting moved 1 MiB blocks ~40% faster than posting in line, so the
  agent is measured against both;
- memcpy: numpy copies of the same blocks in this process (the machine's limit).

A pod of several ranks counts every rank's bytes over the join of its ranks' transfer windows; its
latency is its slowest rank's median. After the timed runs, one more agent run with verification on
(``verify_rooms`` rooms) checks every byte each decode rank received, per component
(``verified``: every component of every rank verified, none mismatched).

Each figure is the median over the repetitions. ``overhead_us`` = agent median latency minus raw median
latency per request: what the agent's control path (two control hops, planning, accounting) adds.
``prefill_cpu_us`` / ``prefill_worker_cpu_us``: CPU µs per room the prefill agent spent (its process /
its role-worker thread, from ``/proc``, warm-up rooms included) — with rooms in flight the worker's
figure is the agent's throughput limit, whatever else the machine was doing;
``decode_worker_cpu_us``: the same for decode's role worker (which side bounds small rooms).
"""

from __future__ import annotations

import collections
import dataclasses
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
from ...schema import RoleSchema
from ...schema.profiles import schema_from_config
from ...transports.nixl import NixlTransport, load_sdk, ucx_environment
from ..agent_processes import run_pair

VERIFY_ROOMS = 8
"""Rooms of each case's verification run (every byte checked on decode, per component)."""


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


@dataclasses.dataclass(frozen=True)
class Pods:
    """A case's ranks: every prefill and decode rank's schema, which (prefill, decode) rank pairs
    exchange state (sglang's rule, ``planner.target_ranks``), and where each rank's regions start when
    a pod's ranks are registered as one list (the raw engine's and memcpy's layout)."""

    prefill: tuple[RoleSchema, ...]
    decode: tuple[RoleSchema, ...]
    pairs: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, cfg: Any) -> Pods:
        ptp, dtp = cfg.prefill.tp_size, cfg.decode.tp_size
        prefill = tuple(schema_from_config(as_role(cfg, "prefill").for_rank(r)) for r in range(ptp))
        decode = tuple(schema_from_config(as_role(cfg, "decode").for_rank(r)) for r in range(dtp))
        pairs = tuple((p, d) for p in range(ptp) for d in planner.target_ranks(ptp, dtp, p))
        return cls(prefill, decode, pairs)

    @staticmethod
    def _starts(schemas: tuple[RoleSchema, ...]) -> list[int]:
        return [0, *np.cumsum([len(s.regions()) for s in schemas]).tolist()][:-1]

    def plans(self, tokens: int, slot: int = 0) -> list[Any]:
        """The request's plan of every rank pair, as the agent makes it when it holds the ``slot``-th
        set of items, its region ids moved to the pods' joined region lists: rooms in flight hold
        distinct items, so the raw engine cycles through as many sets as the agent has rooms in flight
        and touches as much memory (one set for all requests would keep the raw engine's pages hot in
        cache and free of first-touch faults that the agent pays)."""
        lstart, rstart = self._starts(self.prefill), self._starts(self.decode)
        out = []
        for p, d in self.pairs:
            c = items_for_tokens(self.decode[d], tokens)
            kv = np.arange(c.kv, dtype=np.int32) + slot * c.kv
            state = [np.arange(n, dtype=np.int32) + slot * n for n in c.state]
            aux = slot if c.aux else None
            req = planner.RequestIndices(kv, kv, aux, aux, state, state)
            plan = planner.plan_request(self.prefill[p], planner.PeerLayout.from_schema(self.decode[d]), req)
            out.append(dataclasses.replace(
                plan,
                local_region=(plan.local_region + lstart[p]).astype(np.int32),
                remote_region=(plan.remote_region + rstart[d]).astype(np.int32),
            ))
        return out


def run_case(label: str, cfg: Any, *, repeat: int, warmup: int) -> dict[str, Any]:
    n, depth = cfg.synthetic.requests, cfg.synthetic.max_inflight
    pods = Pods.of(cfg)
    sizes = tokens_of(cfg, warmup + n)
    plans = [pods.plans(t, i % depth) for i, t in enumerate(sizes)]
    timed = plans[warmup:]
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
        copies.append(memcpy_run(pods, timed))
    check = verify_run(cfg)
    med = statistics.median
    agent = {k: med(a[k] for a in agents) for k in agents[0]}
    raw = {k: med(r[k] for r in raws) for k in raws[0]}
    raw_threaded = med(r["gbps"] for r in threads)
    moved = sum(p.total_bytes for request in timed for p in request)
    per_request = moved / max(1, n)
    return {
        "case": label,
        "prefill_tp": cfg.prefill.tp_size,
        "decode_tp": cfg.decode.tp_size,
        "requests": n,
        "warmup": warmup,
        "repeat": repeat,
        "bytes_per_request": moved // max(1, n),
        "agent_bytes_per_request": round(agent["bytes_per_room"]),
        "writes_per_request": sum(p.writes for request in timed for p in request) // max(1, n),
        "plan_rows_per_request": sum(len(p) for request in timed for p in request) // max(1, n),
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
        **check,
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


def _pair(cfg: Any) -> dict[str, Any]:
    return run_pair(cfg, prefix="pdpair-bench-", prefill_tp=cfg.prefill.tp_size, decode_tp=cfg.decode.tp_size)


def _agent_pair(cfg: Any) -> dict[str, float]:
    st = _pair(cfg)
    ranks = list(st["ranks"].values())
    total = sum(c["bytes"] for r in ranks for c in r["components"].values())
    bounds = [r["transfer_window_bounds"] for r in ranks if r.get("transfer_window_bounds")]
    window = max(b[1] for b in bounds) - min(b[0] for b in bounds) if bounds else 0.0
    p50 = max(r["components"]["kv"]["p50_ms"] for r in ranks) * 1e3
    rooms = max(1, cfg.synthetic.requests)
    cpu = {k: (v if v is not None else math.nan) / rooms * 1e6 for k, v in st["prefill_cpu"].items()}
    dcpu = {k: (v if v is not None else math.nan) / rooms * 1e6 for k, v in st["decode_cpu"].items()}
    counted = max(1, cfg.synthetic.requests - cfg.synthetic.warmup)  # warm-up rooms are not in the stats
    return {
        "gbps": total / window / 1e9 if window else 0.0, "p50_us": p50, "bytes_per_room": total / counted,
        "prefill_cpu_us": cpu["process_seconds"], "prefill_worker_cpu_us": cpu["worker_seconds"],
        "decode_worker_cpu_us": dcpu["worker_seconds"],
    }


def verify_run(cfg: Any, rooms: int = VERIFY_ROOMS) -> dict[str, Any]:
    """One agent run of ``rooms`` rooms with verification on (prefill fills, every decode rank checks
    every byte it received): ``verified`` when every component of every decode rank verified all its
    bytes and none mismatched; ``verified_components`` names the components checked."""
    syn = msgspec.structs.replace(cfg.synthetic, requests=rooms, warmup=0, verify=True)
    st = _pair(msgspec.structs.replace(cfg, synthetic=syn))
    ok, names = True, set()
    for rank in st["ranks"].values():
        comps = rank["components"]
        names.update(comps)
        ok = ok and rank["requests"]["succeeded"] >= rooms and rank["requests"]["verification_failures"] == 0
        ok = ok and bool(comps) and all(
            c["verified_bytes"] == c["bytes"] > 0 and c["mismatched_bytes"] == 0 for c in comps.values()
        )
    return {"verified": ok, "verified_components": sorted(names), "verified_rooms": rooms}


def _quiet_nixl() -> None:
    """NIXL logs INFO lines to stdout, which ``--json`` keeps for the results."""
    load_sdk()
    logging.getLogger("nixl").setLevel(logging.WARNING)


def _target(cfg: Any, conn: Any) -> None:
    """Raw NIXL's passive side: register the decode layout, hand out its blobs, wait."""
    _quiet_nixl()
    os.environ.update(ucx_environment(cfg.transfer.nixl))  # this process starts here
    pools = [MemoryPools.allocate(s, prefault=True) for s in Pods.of(cfg).decode]
    transport = NixlTransport("bench-raw-target", cfg.transfer.nixl.for_role("decode"))
    blobs = transport.register([r for p in pools for r in p.memory_regions()])
    conn.send((transport.endpoint(), blobs))
    conn.recv()
    transport.close()


def raw_run(cfg: Any, plans: list[list[Any]], warmup: int, depth: int = 1) -> dict[str, float]:
    """``plans``: per request, the plan of every rank pair (``Pods.plans``)."""
    _quiet_nixl()
    os.environ.update(ucx_environment(cfg.transfer.nixl))  # the benchmark's own process, as an agent's
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_target, args=(cfg, there), daemon=True)
    child.start()
    try:
        endpoint, blobs = here.recv()
        pools = [MemoryPools.allocate(s, prefault=True) for s in Pods.of(cfg).prefill]
        bare = msgspec.structs.replace(cfg.transfer.nixl.for_role("prefill"), post_thread=False)
        with NixlTransport("bench-raw-initiator", bare) as transport:
            transport.register([r for p in pools for r in p.memory_regions()])
            peer = transport.connect("target", endpoint, blobs)
            parts = [[w for plan in request for _, w in transfer_requests(plan)] for request in plans]
            _pipeline(transport, peer, parts[:warmup], depth)
            start = time.perf_counter()
            times = _pipeline(transport, peer, parts[warmup:], depth)
            elapsed = time.perf_counter() - start
        here.send("stop")
    finally:
        child.join(10)
    total = sum(p.total_bytes for request in plans[warmup:] for p in request)
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


def memcpy_run(pods: Pods, plans: list[list[Any]]) -> float:
    """numpy copies of exactly the planned blocks, between host pools of every rank in this process
    (a strided row as one strided copy: its ``count`` blocks at their strides on each side)."""
    src = [b for s in pods.prefill for b in MemoryPools.allocate(s, prefault=True).buffers]
    dst = [b for s in pods.decode for b in MemoryPools.allocate(s, prefault=True).buffers]
    rows = [_copy_rows(p) for request in plans for p in request]
    start = time.perf_counter()
    for blocks in rows:
        for lr, lo, rr, ro, n, count, ls, rs in blocks:
            if count == 1:
                dst[rr][ro : ro + n] = src[lr][lo : lo + n]
            else:
                a = np.lib.stride_tricks.as_strided(src[lr][lo:], (count, n), (ls, 1))
                b = np.lib.stride_tricks.as_strided(dst[rr][ro:], (count, n), (rs, 1))
                np.copyto(b, a)
    elapsed = time.perf_counter() - start
    return sum(p.total_bytes for request in plans for p in request) / elapsed / 1e9


def _copy_rows(plan: Any) -> list[tuple[int, ...]]:
    fields = ("local_region", "local_offset", "remote_region", "remote_offset", "size")
    cols = [getattr(plan, f).tolist() for f in fields]
    rep = plan.repeat if plan.repeat is not None else np.array([[1], [0], [0]]).repeat(len(plan), axis=1)
    return list(zip(*cols, *rep.tolist(), strict=True))



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
    ("case", "case", "<20", ""), ("requests", "requests", ">8", ""),
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
    ("verified", "verified", ">8", ""),
)


def table(results: list[dict[str, Any]]) -> str:
    head = " ".join(f"{title:{align}}" for title, _, align, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(" ".join(_cell(r.get(key), align, fmt) for _, key, align, fmt in COLUMNS))
    return "\n".join(lines)


def _cell(value: Any, align: str, fmt: str) -> str:
    if value is None:
        return f"{'-':{align}}"
    if isinstance(value, bool):
        return f"{'yes' if value else 'NO':{align}}"
    return f"{value:{align}{fmt}}"


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


__all__ = ["Pods", "agent_run", "memcpy_run", "raw_run", "record", "run_case", "run_cases", "table",
           "verify_run"]
