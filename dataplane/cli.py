"""``pdpair-agent``: the agent's command line. A thin dispatcher; each command group lives in its own
module that exposes ``register(subparsers)`` and keeps heavy imports (numpy, zmq, the transfer
engines) inside its handlers, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from .commands import bench, demo, engine, run, sidecar_bench, wire
from .commands.args import Parser, add_version
from .errors import PDPairError

COMMANDS: tuple[ModuleType, ...] = (run, demo, bench, wire, engine, sidecar_bench)
HARNESS = "dataplane.harness"
"""The launchers, demo and benchmarks: only ``demo``, ``bench`` and ``sidecar-bench`` import it, when
they run; the images leave its benchmarks out."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="pdpair-agent",
        description="PDPair data-plane agent: moves per-component hybrid-model state from prefill to decode.",
    )
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `engine` starts itself once per rank
    try:
        return int(args.handler(args) or 0)
    except PDPairError as exc:
        print(f"pdpair-agent: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith(HARNESS):
            raise
        print(f"pdpair-agent: error: {args.command} needs {exc.name} (the harness), which the images leave "
              "out; run it from a source checkout of PDPair", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def one_line(message: str) -> str:
    """An error message on one line (a YAML parser's message can span several)."""
    return " ".join(message.split())


if __name__ == "__main__":
    sys.exit(main())
