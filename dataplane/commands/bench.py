"""``pdpair-agent bench transfer``: the agent's end-to-end state send vs raw NIXL (no agent) writing the
same blocks vs a plain memcpy of the same bytes, side by side in one run (``dataplane.harness.bench.transfer``
measures; this module parses, renders and records).

Block-size cases use a KV-only model whose page is the block (each request = one page of K and one of
V); the mix case cycles a model profile's request lengths between pods of equal TP; each TP room
(``--tp-rooms``) runs that mix between a prefill pod of TP P and a decode pod of TP D, every rank of a
pod served by its one agent. Agent and raw NIXL get the same ``NixlConfig`` (``--ucx-tls``), and the
UCX_* variables this process inherits reach both alike. Every case ends with a verified run: every
byte each decode rank received checked per component.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..schema.profiles import profile_names
from .args import integer, listed, one_of, output_file, plain, size

SIZES = "4K,64K,1M,4M,16M,64M"
CASE_BYTES = 256 << 20
MAX_BLOCK = 256 << 20
"""Each block-size case's agent holds at least two pages of K and of V per room in flight."""
MAX_INFLIGHT = 64
TP_ROOMS = "qwen3-next:1-2,pure-kv:2-1"
MAX_TP = 8
"""A TP room starts one agent process per pod serving all its ranks; 8 ranks is the largest pod here."""


def tp_room(text: str) -> tuple[str, int, int]:
    """One ``--tp-rooms`` entry, ``PROFILE:P-D``: the profile's mix from prefill TP P to decode TP D."""
    name, sep, sizes = text.strip().partition(":")
    p, dash, d = sizes.partition("-")
    if not sep or not dash:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not PROFILE:P-D: write e.g. qwen3-next:1-2 (prefill TP 1 to decode TP 2)"
        )
    profile = one_of(profile_names(), "profile")(name)
    tp = integer(1, MAX_TP)
    ptp, dtp = tp(p), tp(d)
    for n in (ptp, dtp):
        if n & (n - 1):
            raise argparse.ArgumentTypeError(f"{text!r}: TP {n} is not a power of two; give 1, 2, 4 or 8")
    if ptp == dtp:
        raise argparse.ArgumentTypeError(
            f"{text!r}: prefill and decode TP are equal; a TP room has different sizes (--mix is equal TP)"
        )
    return profile, ptp, dtp


def tp_rooms(text: str) -> tuple[tuple[str, int, int], ...]:
    """``--tp-rooms``: TP-mismatched rooms, comma-separated, or '' for none."""
    return listed(tp_room, "TP rooms", 8, min_items=0)(text)


def block_sizes(text: str) -> tuple[int, ...]:
    """``--sizes``: block sizes, 64 bytes to 256M each ('' for none: the mix case alone)."""
    return listed(size(64, MAX_BLOCK), "block sizes", 32, min_items=0)(text)


def mix_profile(text: str) -> str:
    """``--mix``: a model profile, or '' for no mix case."""
    return one_of(profile_names(), "profile", empty=True)(text)


def add_case_options(
    p: argparse.ArgumentParser, sizes: str, case_bytes: int, max_requests: int, repeat: int
) -> None:
    """The case options ``bench transfer`` and ``sidecar-bench`` share."""
    p.add_argument("--sizes", type=block_sizes, default=sizes,
                   help=f"block sizes, comma-separated, each 64 to 256M, or '' for none (default: {sizes})")
    p.add_argument("--mix", type=mix_profile, default="qwen3-next", metavar="PROFILE",
                   help=f"model profile for the request-mix case, one of {', '.join(profile_names())}, "
                   "or '' for none (default: qwen3-next)")
    p.add_argument("--case-bytes", type=size(1 << 20, 1 << 40), default=case_bytes,
                   help=f"bytes moved per case, 1M to 1T (default: {case_bytes >> 20}M)")
    p.add_argument("--max-requests", type=integer(1, 1_000_000), default=max_requests,
                   help=f"cap on requests per case, 1 to 1,000,000 (default: {max_requests})")
    p.add_argument("--repeat", type=integer(1, 100), default=repeat,
                   help=f"repetitions per case, 1 to 100; figures are medians (default: {repeat})")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="benchmarks that write JSON results")
    sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    _add_codec(sub)
    _add_attacks(sub)
    t = sub.add_parser(
        "transfer",
        help="agent vs raw NIXL vs memcpy on the same blocks",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_case_options(t, SIZES, CASE_BYTES, 400, 3)
    t.add_argument(
        "--tp-rooms", type=tp_rooms, default=TP_ROOMS, metavar="PROFILE:P-D,...",
        help="TP-mismatched rooms: a profile's request mix from a prefill pod of TP P to a decode pod of TP "
        f"D (P, D powers of two up to {MAX_TP}), comma-separated, or '' for none (default: {TP_ROOMS})",
    )
    t.add_argument("--warmup", type=integer(0, 10_000), default=5,
                   help="untimed requests before each timed run, 0 to 10,000 (default: 5)")
    t.add_argument(
        "--inflight", type=integer(1, MAX_INFLIGHT), default=1,
        help="rooms in flight per decode, and requests outstanding in raw NIXL's loop, 1 to 64 "
        "(default: 1)",
    )
    t.add_argument(
        "--ucx-tls", default=None, help="UCX_TLS for the agent and raw NIXL alike (default: UCX's own)"
    )
    t.add_argument(
        "--nixl-threads", type=integer(0, 64), default=0,
        help="NIXL UCX worker threads for the agent and raw NIXL alike, 0 to 64 (default: 0, the "
        "caller's)",
    )
    t.add_argument(
        "--no-post-thread", action="store_true",
        help="the agent posts host writes in line (NixlConfig.postThread off); raw NIXL always does",
    )
    t.add_argument(
        "--no-native-poster", action="store_true",
        help="the agent's posting thread is Python's (NixlConfig.nativePoster off)",
    )
    t.add_argument(
        "--no-lanes", action="store_true",
        help="the agents' control frames over ZMQ only (listen.lanes off), as with sglang peers",
    )
    t.add_argument(
        "--spin-us", type=integer(0, 100_000), default=0, metavar="US",
        help="the agents' transfer.spinMicroseconds: poll without sleeping this long after each message "
        "(0 to 100,000)",
    )
    t.add_argument(
        "--coalesce-bytes", type=size(0, 64 << 20), default=None, metavar="N",
        help="the prefill agent's transfer.coalesceBytes, 0 to 64M (0: every room its own engine request)",
    )
    add_compiled_option(t)
    t.add_argument("--json", action="store_true", help="print a JSON list of cases")
    t.add_argument("--record", type=output_file, metavar="FILE",
                   help="write the run (date, machine, command, table, JSON) to FILE, replacing it")
    t.set_defaults(handler=run)


def _add_attacks(sub: Any) -> None:
    """``bench attacks``: a stranger's attacks on a real loopback pair (``harness.bench.attacks``)."""
    a = sub.add_parser(
        "attacks",
        help="attack a real loopback pair as a stranger would; print attack, outcome, bound",
        description="Starts a prefill/decode pair on 127.0.0.1 with a pairing key, runs every attack of "
        "dataplane/harness/bench/attacks.py against it and prints a Markdown table (exit 1 if a bound "
        "broke).",
    )
    a.add_argument("--only", default=None, metavar="TEXT", help="only the attacks whose name contains TEXT")
    a.add_argument("--json", action="store_true", help="print the findings as JSON, figures included")
    a.set_defaults(handler=_attacks)


def _attacks(args: argparse.Namespace) -> int:
    import dataclasses

    from ..harness.bench.attacks import run_attacks, table

    findings = run_attacks(args.only)
    if args.json:
        print(json.dumps([dataclasses.asdict(f) for f in findings], indent=2, default=str))
    else:
        print(table(findings))
    return 0 if findings and all(f.passed for f in findings) else 1


def _add_codec(sub: Any) -> None:
    """``bench codec``: our codec + planner vs sglang 0.5.23's own helpers (``harness.bench.codec``)."""
    c = sub.add_parser(
        "codec",
        help="codec + planner vs sglang 0.5.23's own helpers, same inputs, one run",
        description="Times our wire codec and transfer planner against sglang's helper functions "
        "(fetched with pip download at run time) on a Qwen3-Next-like 32K-token request.",
    )
    c.add_argument("--json", action="store_true", help="print a JSON list, one object per scenario")
    c.add_argument(
        "--iterations", type=integer(1, 10_000_000), default=2000,
        help="at most this many calls per timed batch, 1 to 10,000,000 (default: 2000)",
    )
    c.add_argument(
        "--rounds", type=integer(1, 1000), default=9,
        help="alternating rounds of one batch per side, 1 to 1000 (default: 9)",
    )
    c.add_argument(
        "--cpu", type=integer(0, 65_535), default=None,
        help="the CPU to pin the benchmark to, one this process may use (default: the highest-numbered "
        "one it may use)",
    )
    c.add_argument("--no-pin", action="store_true", help="leave the process's CPU affinity as it is")
    c.add_argument("--only", default=None, metavar="TEXT", help="only the scenarios whose name contains TEXT")
    c.add_argument("--cache-dir", type=Path, default=None, help="where the sglang wheel is cached")
    c.set_defaults(handler=_codec)


def _codec(args: argparse.Namespace) -> int:
    from ..harness.bench import codec, sglang_ref

    cache = args.cache_dir or sglang_ref.DEFAULT_CACHE
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if args.cpu is not None and not args.no_pin and allowed and args.cpu not in allowed:
        raise BadInput(f"--cpu {args.cpu}: this process may run on CPUs {_ranges(allowed)} only; pick one")
    results = codec.run(
        iterations=args.iterations,
        cache_dir=cache,
        rounds=args.rounds,
        cpu=args.cpu,
        pin=not args.no_pin,
        only=args.only,
    )
    print(codec.render(results, args.json))
    return 0


def _ranges(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out: list[str] = []
    start = prev = cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(out)


def run(args: argparse.Namespace) -> int:
    from ..config import NixlConfig
    from ..harness.agent_processes import compiled_agents
    from ..harness.bench import cases, transfer

    require_cases(args)
    nixl = NixlConfig(
        ucx_tls=args.ucx_tls, num_threads=args.nixl_threads, post_thread=not args.no_post_thread,
        native_poster=not args.no_native_poster,
    )
    chosen = cases.cases(args.sizes, args.mix, case_bytes=args.case_bytes, max_requests=args.max_requests,
                         mix_requests=200, inflight=args.inflight, nixl=nixl)
    for profile, ptp, dtp in args.tp_rooms:
        room = cases.mix_config(profile, min(args.max_requests, 200), nixl, args.inflight, ptp, dtp)
        check_tp_room(f"{profile}:{ptp}-{dtp}", room)
        chosen.append((f"{profile} TP{ptp}->{dtp}", room))
    compiled = compiled_agents(args.compiled)
    if compiled is None:
        return 2
    results = transfer.run_cases(chosen, repeat=args.repeat, warmup=args.warmup, lanes=not args.no_lanes,
                                 spin_us=args.spin_us, coalesce_bytes=args.coalesce_bytes, compiled=compiled)
    print(json.dumps(results, indent=1) if args.json else transfer.table(results))
    if args.record:
        transfer.record(Path(args.record), results, " ".join(["pdpair-agent", *sys.argv[1:]]))
    return 0


def require_cases(args: argparse.Namespace) -> None:
    if not args.sizes and not args.mix and not getattr(args, "tp_rooms", ()):
        what = "--sizes '', --mix ''" + (" and --tp-rooms ''" if hasattr(args, "tp_rooms") else "")
        raise BadInput(f"{what}: nothing to measure; give block sizes, a profile or both")


def check_tp_room(name: str, cfg: Any) -> None:
    """A TP room the profile cannot split (say, more ranks than KV heads) is the user's mistake: one
    line naming the room, before any agent starts."""
    from ..errors import PlanError, SchemaError
    from ..harness.bench.transfer import Pods

    try:
        Pods.of(cfg).plans(max(cfg.synthetic.tokens))
    except (PlanError, SchemaError) as exc:
        raise BadInput(f"--tp-rooms {name}: {exc}; pick TP sizes the profile splits") from None


def add_compiled_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compiled", choices=("on", "auto", "off"), default="on",
        help="the agents' per-room modules compiled with mypyc, as the image runs them (dataplane/compiled; "
        "on: built first if needed, ~1 min once per source version; off: interpreted)",
    )
