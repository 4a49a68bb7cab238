"""``python -P -m dataplane.compiled [--in-place]``: build the compiled per-room modules (see the package)."""

from __future__ import annotations

import argparse
import sys

from . import PACKAGE, CompileUnavailable, build, build_in_place


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m dataplane.compiled", description=__doc__)
    p.add_argument(
        "--in-place", action="store_true",
        help="compile the installed package where it is (images), not a copy in the cache",
    )
    args = p.parse_args()
    try:
        if args.in_place:
            site = PACKAGE.parent
            if (site / "pyproject.toml").exists():
                raise CompileUnavailable(
                    f"{site} is a checkout: extensions beside its sources would shadow every edit "
                    "(build the copy instead: no --in-place)"
                )
            build_in_place(site)
            print(site / "dataplane")
        else:
            print(build())
    except CompileUnavailable as exc:
        print(f"compiled modules not built: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
