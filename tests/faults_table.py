"""Renders the fault matrix's rows (JSON lines written by the tests marked ``faults``) as the
Markdown page ``docs/faults.md``, with the date, the machine and the command."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

HEADER = "| fault | how injected | bound | worst observed | outcome |\n| --- | --- | --- | --- | --- |\n"


def render(rows: list[dict[str, str]], machine: str, when: str) -> str:
    cells = ("fault", "injected", "bound", "observed", "outcome")
    body = "".join("| " + " | ".join(r[c] for c in cells) + " |\n" for r in rows)
    return (
        "# Fault matrix\n\n"
        "Each row is a test in `make test` (marked `faults`); `make faults` runs them alone and writes this "
        "page.\n\n"
        f"{when}, {machine}, `make faults`:\n\n{HEADER}{body}"
    )


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor() or platform.machine())
    return f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: faults_table.py ROWS.jsonl OUT.md", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line.strip()]
    if not rows:
        print(f"faults_table: {argv[0]} holds no rows (did the tests run?)", file=sys.stderr)
        return 1
    text = render(rows, machine(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    Path(argv[1]).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
