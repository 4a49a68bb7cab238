"""``pdpair-agent``: the agent's command line. A thin dispatcher; each command group lives in its own
module that exposes ``register(subparsers)`` and keeps heavy imports inside its handlers, so
``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .commands.args import Parser, add_version
from .errors import PDPairError

COMMAND_MODULES = (
    "dataplane.commands.run",
    "dataplane.commands.demo",
    "dataplane.commands.bench",
    "dataplane.commands.wire",
    "dataplane.commands.engine",
    "dataplane.commands.sidecar_bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="pdpair-agent",
        description="PDPair data-plane agent: moves per-component hybrid-model state from prefill to decode.",
    )
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `engine` starts itself once per rank
    try:
        return int(args.handler(args) or 0)
    except PDPairError as exc:
        print(f"pdpair-agent: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def one_line(message: str) -> str:
    """An error message on one line (a YAML parser's message can span several)."""
    return " ".join(message.split())


if __name__ == "__main__":
    sys.exit(main())
