"""``pdpair-agent sidecar-bench``: the agent benchmark (``bench transfer``) rerun through the local API.

Per case (a block size, or a model profile's request mix) and in one run, side by side:

- direct: the agent with its in-process synthetic engine, measured like ``bench transfer``'s agent
  column (two ``pdpair-agent run`` processes, ``--inflight`` rooms in flight, verification off);
- sidecar: per role an agent in sidecar mode plus a synthetic engine process speaking the local API
  (four processes), engine memory in shared memory, the same requests and rooms in flight, no
  verification. GB/s and µs per request come from the decode engine: bytes over its window from the
  first ``expect`` to the last Success, as the direct column measures decode's window.

``ratio`` = sidecar GB/s ÷ direct GB/s; ``interface_us`` = sidecar µs/request - direct µs/request;
``api_us`` is the mean time of one ``expect`` call (the engine-side cost of a request). The sidecar
runs twice: prefill engine reacting to decode's requests (its synthetic default: one more local-API
round trip per request on the critical path), and ``presend`` — the prefill engine sends each room
before decode asks (a router handing the request to both sides), the order a real prefill engine
that finished its forward pass produces; the ``presend_*`` columns.

The defaults make each run's window last about a second on a 16-core host: with 64 MiB and 200
requests per case, a 4 KiB run lasted ~0.1 s and one run's ratio swung 0.6-1.0 between repetitions of
the same code; with 1 GiB and 2,000 (sessions 3-18) a 1 MiB run at ~10 GB/s lasted ~0.1 s again.

With a fixed number of rooms in flight, a room's slot stays empty from its Success until the engine's
next request reaches the agent: two process wake-ups on the sidecar's path that the in-process engine
never pays (~130 µs a room on the benchmark hosts). A serving engine's scheduler loop polls without
sleeping (sglang's default; ``--sleep-on-idle`` turns it off), which the synthetic engines do here:
each of their waits polls for ``--engine-poll-us`` before it blocks (default 1000 µs, so with rooms in
flight they hardly sleep, and idle they poll ~1 ms of every 50; 0: they block at once), and the agents poll
for the engine's answer after pushing a state it acts on (``--reply-spin-us``, default the config's
``localapi.engine.replySpinMicroseconds``).

``sidecar_huge_pages`` (table: ``huge``): both sidecar engines' pools were in reserved 2 MiB huge pages
(``--huge-pages``, default ``auto``: when the host has enough). The direct agent's own pools get
transparent huge pages; ordinary shared pages slow the copy (docs/sidecar.md).

``*_prefill_process_us`` / ``*_prefill_worker_us``: CPU µs per room the prefill agent spent (its whole
process / its role-worker thread) from ready to the last room, warm-up rooms included: where the
interface's cost lands, independent of how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .args import integer, plain
from .bench import MAX_INFLIGHT, add_case_options, add_compiled_option

SIZES = "4K,64K,1M,16M"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sidecar-bench",
        help="the transfer benchmark through the local API vs the in-process engine",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_case_options(p, SIZES, 8 << 30, 8000, 1)
    p.add_argument("--inflight", type=integer(1, MAX_INFLIGHT), default=1,
                   help="rooms in flight per decode, both setups, 1 to 64 (default: 1)")
    p.add_argument(
        "--warmup", type=integer(0, 10_000), default=5,
        help="first requests of each run left out of the figures (pairing), 0 to 10,000 (default: 5)",
    )
    p.add_argument(
        "--huge-pages", choices=("auto", "always", "never"), default="auto",
        help="the sidecar engines' pools in reserved 2 MiB huge pages (default auto: when the host has them)",
    )
    p.add_argument(
        "--engine-poll-us", type=integer(0, 1_000_000), default=1000, metavar="US",
        help="sidecar: idle, the engines poll the agent without sleeping this long first, as a serving "
        "engine's scheduler loop does (default 1000; 0: they block at once)",
    )
    p.add_argument(
        "--reply-spin-us", type=integer(0, 100_000), metavar="US",
        help="sidecar: the agents' localapi.engine.replySpinMicroseconds (default: the config's, 200)",
    )
    add_compiled_option(p)
    p.add_argument("--json", action="store_true", help="print a JSON list of cases")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .bench import block_config, compiled_agents, mix_config, require_cases

    require_cases(args)

    compiled = compiled_agents(args.compiled, "sidecar-bench")
    if compiled is None:
        return 2
    cases = []
    for size in args.sizes:
        requests = max(20, min(args.max_requests, args.case_bytes // (2 * size)))
        label = f"{size >> 20}MiB" if size >= 1 << 20 else f"{size >> 10}KiB"
        cases.append((label, block_config(size, requests, inflight=args.inflight)))
    if args.mix:
        mix = mix_config(args.mix, min(args.max_requests, 2000), inflight=args.inflight)
        cases.append((f"mix:{args.mix}", mix))
    results = []
    for label, cfg in cases:
        print(f"sidecar-bench: {label} ...", file=sys.stderr, flush=True)
        side = Sidecar(args.huge_pages, args.engine_poll_us, args.reply_spin_us)
        row = run_case(label, with_warmup(cfg, args.warmup), args.repeat, side)
        results.append({**row, "compiled": compiled})
    print(json.dumps(results, indent=1) if args.json else table(results))
    return 0


def with_warmup(cfg: Any, warmup: int) -> Any:
    """``warmup`` more requests, left out of both setups' figures: the sidecar engine's first requests
    wait for the agents to pair, which the in-process engine never counts (it starts once paired)."""
    import msgspec

    syn = cfg.synthetic
    return msgspec.structs.replace(
        cfg, synthetic=msgspec.structs.replace(syn, requests=syn.requests + warmup, warmup=warmup)
    )


def direct_run(cfg: Any) -> dict[str, Any]:
    """The agent with its in-process engine: decode's bytes over its transfer window."""
    from ..agent.launch import run_pair

    st = run_pair(cfg, prefix="pdpair-sidecar-bench-direct-")
    total = sum(c["bytes"] for c in st["components"].values())
    window = st["transfer_window_seconds"]
    n = max(1, st["requests"]["succeeded"] - cfg.synthetic.warmup)
    return {
        "bytes": total, "gbps": total / window / 1e9 if window else 0.0, "us": window / n * 1e6,
        **per_request_cpu(st["prefill_cpu"], cfg.synthetic.requests),
    }


def per_request_cpu(spent: dict[str, float | None], rooms: int) -> dict[str, float]:
    """The prefill agent's CPU µs per room (warm-up rooms included in both the CPU and the count):
    its whole process, and its role-worker thread (NaN where ``/proc`` has no figure)."""
    return {
        f"prefill_{key}_us": (spent[f"{key}_seconds"] or math.nan) / max(1, rooms) * 1e6
        for key in ("process", "worker")
    }


@dataclass(frozen=True)
class Sidecar:
    """How the sidecar setup runs: the engines' pools, their idle polling, the agents' reply spin."""

    huge_pages: str = "auto"
    engine_poll_us: int = 1000
    reply_spin_us: int | None = None
    """None: the config's ``localapi.engine.replySpinMicroseconds``."""


def run_case(label: str, cfg: Any, repeat: int = 1, setup: Sidecar = Sidecar()) -> dict[str, Any]:
    runs = [
        (direct_run(cfg), sidecar_run(cfg, False, setup), sidecar_run(cfg, True, setup))
        for _ in range(repeat)
    ]
    med, spin = statistics.median, setup.reply_spin_us
    direct, side, ahead = ({k: med(r[i][k] for r in runs) for k in runs[0][i]} for i in range(3))
    huge = all(r[i]["huge_pages"] for r in runs for i in (1, 2))
    return {
        "case": label,
        "requests": cfg.synthetic.requests - cfg.synthetic.warmup,
        "warmup": cfg.synthetic.warmup,
        "inflight": cfg.synthetic.max_inflight,
        "bytes": side["bytes"],
        "direct_gbps": round(direct["gbps"], 4),
        "sidecar_gbps": round(side["gbps"], 4),
        "ratio": round(side["gbps"] / direct["gbps"], 4) if direct["gbps"] else None,
        "direct_us_per_request": round(direct["us"], 1),
        "sidecar_us_per_request": round(side["us"], 1),
        "interface_us": round(side["us"] - direct["us"], 1),
        "api_us": side["api_us"],
        "sidecar_huge_pages": huge,
        "engine_poll_us": setup.engine_poll_us,
        "reply_spin_us": cfg.localapi.engine.reply_spin_microseconds if spin is None else spin,
        "presend_gbps": round(ahead["gbps"], 4),
        "presend_ratio": round(ahead["gbps"] / direct["gbps"], 4) if direct["gbps"] else None,
        "presend_interface_us": round(ahead["us"] - direct["us"], 1),
        "ratio_runs": [round(s["gbps"] / d["gbps"], 3) if d["gbps"] else None for d, s, _ in runs],
        "presend_ratio_runs": [round(a["gbps"] / d["gbps"], 3) if d["gbps"] else None for d, _, a in runs],
        **{
            f"{setup}_prefill_{key}_us": _rounded(figures[f"prefill_{key}_us"])
            for setup, figures in (("direct", direct), ("sidecar", side), ("presend", ahead))
            for key in ("process", "worker")
        },
    }


def _cpu_pair(r: dict[str, Any]) -> str:
    """The prefill agent's CPU per request, direct / sidecar ("-" where /proc gave none)."""
    d, s = r["direct_prefill_process_us"], r["sidecar_prefill_process_us"]
    return f"{d:.0f}/{s:.0f}" if d is not None and s is not None else "-"


def _rounded(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 1)


def sidecar_run(cfg: Any, presend: bool, side: Sidecar = Sidecar()) -> dict[str, Any]:
    from ..agent.launch import CpuProbe
    from ..localapi.launch import SidecarPair

    syn = cfg.synthetic
    if side.reply_spin_us is not None:
        cfg = cfg.with_engine(reply_spin_microseconds=side.reply_spin_us)
    common = ["--requests", str(syn.requests), "--no-verify", "--room-base", str(1 << 40),
              "--tokens", ",".join(str(t) for t in syn.tokens)]
    inflight = syn.max_inflight
    engine = ["--huge-pages", side.huge_pages, "--poll-us", str(side.engine_poll_us)]
    prefill = [*common, "--presend", str(inflight + 1), *engine] if presend else engine
    decode_args = [*common, "--inflight", str(inflight), *engine]
    with tempfile.TemporaryDirectory(prefix="pdpair-sidecar-bench-") as tmp, \
            SidecarPair(cfg, Path(tmp), decode_args=decode_args, prefill_args=prefill) as pair:
        cpu = CpuProbe(pair.agents["prefill"])
        decode = pair.engines["decode"]
        decode.wait(600)
        rep = decode.report()
        huge = rep.get("huge_pages", False) and pair.engines["prefill"].report().get("huge_pages", False)
        spent = cpu.spent()
    n = max(1, int(rep["counts"].get("measured", 0)))
    window = float(rep["window_seconds"])
    return {
        "bytes": rep["bytes"],
        "gbps": rep["bytes"] / window / 1e9 if window else 0.0,
        "us": window / n * 1e6,
        "api_us": rep["api_us_per_call"],
        "huge_pages": bool(huge),
        **per_request_cpu(spent, syn.requests),
    }


def table(results: list[dict[str, Any]]) -> str:
    cols = [
        ("case", "case", 16, ""), ("requests", "requests", 8, ""), ("direct GB/s", "direct_gbps", 11, ".3f"),
        ("sidecar GB/s", "sidecar_gbps", 12, ".3f"), ("ratio", "ratio", 6, ".3f"),
        ("presend GB/s", "presend_gbps", 12, ".3f"), ("ratio", "presend_ratio", 6, ".3f"),
        ("direct us/req", "direct_us_per_request", 13, ".1f"), ("interface us", "interface_us", 12, ".1f"),
        ("presend us", "presend_interface_us", 10, ".1f"), ("api us", "api_us", 7, ".1f"),
        ("prefill CPU us d/s", "prefill_cpu", 18, ""), ("huge", "sidecar_huge_pages", 5, ""),
    ]
    head = " ".join(f"{title:>{w}}" if i else f"{title:<{w}}" for i, (title, _, w, _) in enumerate(cols))
    lines = [head, "-" * len(head)]
    for r in results:
        cells = []
        for i, (_, key, w, fmt) in enumerate(cols):
            value: Any
            if key == "prefill_cpu":
                value = _cpu_pair(r)
            elif key == "sidecar_huge_pages":
                value = "yes" if r[key] else "no"
            else:
                value = r[key] if r[key] is not None else 0
            cells.append(f"{value:{'<' if not i else '>'}{w}{fmt}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)
