"""``pdpair-agent engine``: the synthetic engine as its own process, beside a sidecar agent.

It allocates its pools in shared memory per the agent config (or ``--profile``), registers them with
the agent listening on ``--socket`` (an agent run with ``localapi.engine.mode: external``), and drives
rooms through the local API: decode originates and verifies requests, prefill fills and sends what
decode asks for. ``--report FILE`` keeps a JSON summary (counts, per-component verification) fresh
twice a second; the summary is printed on exit. Exit status 1 when a byte failed verification.

With ``<role>.tpSize`` N > 1 and no ``--tp-rank``, it runs one process per rank
(``synthetic_engine.rank_processes``), each connecting to the agent on its own, as a serving engine's
scheduler processes do.

In a pod it is the transfer canary the operator runs when a PDPair names no engine image.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any

from ..schema.profiles import profile_names
from .args import add_log_level, integer, listed, number, one_of, output_file, plain


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "engine",
        help="the synthetic engine as a separate process, speaking the local API to a sidecar agent",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--role", choices=("prefill", "decode"), required=True)
    p.add_argument("--socket", help="the agent's local API socket (default: the config's socketPath)")
    p.add_argument("--config", metavar="FILE", help="the agent's config (YAML or JSON): same schema")
    profiles = profile_names()
    p.add_argument("--profile", type=one_of(profiles, "profile"), metavar="PROFILE",
                   help=f"model profile, one of {', '.join(profiles)} (overrides model.profile)")
    p.add_argument("--tp-rank", type=integer(0, 63),
                   help="this engine process's TP rank (default 0); the agent serves each rank on one socket")
    p.add_argument("--tp-size", type=integer(1, 64), help="the engine's TP size (overrides <role>.tpSize)")
    p.add_argument("--dp-size", type=integer(1, 64),
                   help="the engine's DP size, DP attention (overrides <role>.dpSize)")
    p.add_argument("--requests", type=integer(0, 1 << 40),
                   help="stop after this many; 0: until stopped (default: synthetic.requests)")
    p.add_argument("--tokens", type=listed(integer(0, 1 << 20), "token lengths"),
                   help="token lengths, cycled, comma-separated (default: synthetic.tokens)")
    p.add_argument("--inflight", type=integer(1, 4096),
                   help="decode: rooms in flight (default: synthetic.maxInflight)")
    p.add_argument("--room-base", type=integer(0, (1 << 63) - 1), help="first room id (default: random)")
    p.add_argument("--duration", type=number(0, 1e7), default=0.0,
                   help="stop after this many seconds (0: no limit)")
    p.add_argument("--shm-mode", choices=("fd", "shm"), default="fd", help="memfd passing or named /dev/shm")
    p.add_argument("--timeout", type=number(0.001, 3600), default=5.0,
                   help="bound on every local API call (seconds)")
    p.add_argument("--report", type=output_file, metavar="FILE", help="keep a JSON summary here")
    p.add_argument("--presend", type=integer(0, 4096), default=0, metavar="N",
                   help="prefill: send N rooms ahead (room ids from --room-base, sizes from --tokens)")
    p.add_argument("--huge-pages", choices=("auto", "always", "never"),
                   help="host pools in reserved 2 MiB huge pages (default: localapi.engine.hugePages)")
    p.add_argument("--poll-us", type=integer(0, 1_000_000), default=0, metavar="US",
                   help="idle, poll the agent without sleeping this long first (a busy scheduler loop)")
    p.add_argument("--no-verify", action="store_true", help="decode: skip byte verification (benchmarks)")
    add_log_level(p)
    p.set_defaults(handler=run)


def load(args: argparse.Namespace) -> Any:
    import msgspec

    from ..config import AgentConfig, load_config

    cfg = load_config(args.config) if args.config else AgentConfig()
    model = cfg.model if args.profile is None else msgspec.structs.replace(cfg.model, profile=args.profile)
    tp_rank = cfg.tp_rank if args.tp_rank is None else args.tp_rank
    field = "prefill" if args.role == "prefill" else "decode"
    role = getattr(cfg, field)
    role = msgspec.structs.replace(
        role,
        tp_size=role.tp_size if args.tp_size is None else args.tp_size,
        dp_size=role.dp_size if args.dp_size is None else args.dp_size,
    )
    cfg = msgspec.structs.replace(cfg, role=args.role, model=model, tp_rank=tp_rank, **{field: role})
    cfg.check_ranks()
    if args.huge_pages is None:
        return cfg
    return cfg.with_engine(huge_pages=args.huge_pages)


def run(args: argparse.Namespace) -> int:
    from ..synthetic_engine.process import SyntheticEngineProcess
    from .run import setup_logging

    setup_logging("plain", args.log_level)
    cfg = load(args)
    if args.tp_rank is None and cfg.tp_size > 1:  # one process per rank, as a serving engine runs
        from ..synthetic_engine.rank_processes import rank_commands, run_ranks

        return run_ranks(rank_commands(cfg, args.argv, args.report, args.room_base))
    syn = cfg.synthetic
    tokens = args.tokens or syn.tokens
    engine = SyntheticEngineProcess(
        cfg, args.socket or cfg.localapi.engine.socket_path, shm_mode=args.shm_mode, timeout=args.timeout,
        room_base=args.room_base,
    )
    engine.verify_rooms = not args.no_verify and syn.verify
    engine.presend = args.presend
    engine.poll_seconds = args.poll_us * 1e-6
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        summary = engine.run(
            stop,
            requests=syn.requests if args.requests is None else args.requests,
            tokens=tokens,
            max_inflight=syn.max_inflight if args.inflight is None else args.inflight,
            duration=args.duration,
            report=args.report,
        )
    finally:
        engine.close()
    print(json.dumps(summary))
    return 1 if summary["counts"].get("verification_failures") else 0
