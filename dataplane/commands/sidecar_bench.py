"""``pdpair-agent sidecar-bench``: the agent benchmark (``bench transfer``) rerun through the local API.

Per case (a block size, or a model profile's request mix) and in one run, side by side:

- direct: the agent with its in-process synthetic source, measured like ``bench transfer``'s agent
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

The defaults (8 GiB and at most 8,000 requests per case) make each run's window last about a second
on a 16-core host; a window of ~0.1 s leaves one run's ratio swinging 0.6-1.0 between repetitions.

With a fixed number of rooms in flight, a room's slot stays empty from its Success until the engine's
next request reaches the agent: two process wake-ups on the sidecar's path that the in-process source
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
import sys
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
    from ..harness.agent_processes import compiled_agents
    from ..harness.bench import cases, sidecar
    from .bench import require_cases

    require_cases(args)
    compiled = compiled_agents(args.compiled, "sidecar-bench")
    if compiled is None:
        return 2
    chosen = cases.cases(args.sizes, args.mix, case_bytes=args.case_bytes, max_requests=args.max_requests,
                         mix_requests=2000, inflight=args.inflight)
    setup = sidecar.Sidecar(args.huge_pages, args.engine_poll_us, args.reply_spin_us)
    results = []
    for label, cfg in chosen:
        print(f"sidecar-bench: {label} ...", file=sys.stderr, flush=True)
        row = sidecar.run_case(label, sidecar.with_warmup(cfg, args.warmup), args.repeat, setup)
        results.append({**row, "compiled": compiled})
    print(json.dumps(results, indent=1) if args.json else sidecar.table(results))
    return 0
