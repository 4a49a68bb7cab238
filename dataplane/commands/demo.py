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
import sys
from typing import Any

from ..schema.profiles import profile_names
from .args import integer, listed, number, one_of, plain

DEFAULT_TOKENS = "1024,4096,0,300,2048"
POOL_PAGES = 512
MAX_REQUESTS = 32
MAX_TP = 8
MAX_TOKENS = 1 << 20


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
                   help="transport: nixl (default) or cuda-ipc (needs --device cuda and Triton; "
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
    """The model's first layers up to one of each kind (Qwen3-Next: 3 GDN + 1 full attention), each at
    its real size, in a pool of a few hundred MB."""
    from ..config import AgentConfig, ModelConfig, NixlConfig, SyntheticConfig, TransferConfig
    from ..schema.profiles import profile

    return AgentConfig(
        model=ModelConfig(
            profile=args.profile,
            pool_pages=POOL_PAGES,
            max_requests=MAX_REQUESTS,
            layers=profile(args.profile).pattern_layers,
        ),
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
    if args.backend == "cuda-ipc" and args.device != "cuda":
        print("pdpair-agent demo: --backend cuda-ipc moves GPU memory: add --device cuda", file=sys.stderr)
        return 2
    from ..harness import loopback_demo

    if args.sidecar:
        return loopback_demo.run_sidecar_demo(
            demo_config(args), as_json=args.json, timeout=args.timeout, hold=args.hold
        )
    title = (f"profile {args.profile}, prefill TP {args.prefill_tp} -> decode TP {args.decode_tp}, "
             f"{TRANSPORTS[args.backend]}")
    return loopback_demo.run_demo(
        demo_config(args), title=title, prefill_tp=args.prefill_tp, decode_tp=args.decode_tp,
        as_json=args.json, timeout=args.timeout, hold=args.hold,
    )
