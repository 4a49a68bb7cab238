"""Render a dashboard as a PNG from real query results, for people who read the docs without a Grafana.

The panel tests (tests/integration/test_dashboards_prometheus.py, tests/e2e/test_operator_dashboard.py)
run every panel's query against a real Prometheus; with ``PDPAIR_DASHBOARD_DATA=DIR`` they keep the
results as ``DIR/<uid>.jsonl``. This module lays those results out on the dashboard's own grid::

    python -m dashboards.render DIR docs/img
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dashboards.build import DASHBOARDS

ROW_UNITS = 1
SCALE = {"Bps": ("B/s", 1024.0), "bytes": ("B", 1024.0), "s": ("s", 1000.0)}
PREFIXES = {"B/s": ["B/s", "KiB/s", "MiB/s", "GiB/s"], "B": ["B", "KiB", "MiB", "GiB"]}
UNIT_LABEL = {"wps": "writes/s", "reqps": "req/s", "ops": "ops/s", "short": ""}


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def scaled(unit: str, peak: float) -> tuple[str, float]:
    """A readable unit and divisor for a panel whose largest value is ``peak``."""
    if unit == "s":
        return ("ms", 1e-3) if peak < 1 else ("s", 1.0)
    if unit in SCALE:
        base, step = SCALE[unit]
        names, div = PREFIXES[base], 1.0
        for name in names:
            if peak < div * step or name == names[-1]:
                return name, div
            div *= step
    return UNIT_LABEL.get(unit, unit), 1.0


def _plot_panel(ax: Any, record: dict[str, Any], start: float) -> None:
    pairs = zip(record["legends"], record["results"], strict=True)
    series = [(legend(lg, s["metric"]), s["values"]) for lg, result in pairs for s in result]
    peak = max((float(v) for _, vals in series for _, v in vals if v not in ("NaN", "+Inf")), default=0.0)
    unit, div = scaled(record["unit"], peak)
    for name, values in series:
        xs = [float(t) - start for t, v in values if v not in ("NaN", "+Inf")]
        ys = [float(v) / div for _, v in values if v not in ("NaN", "+Inf")]
        ax.plot(xs, ys, linewidth=1.2, label=name)
    ax.set_title(record["title"], fontsize=9, loc="left")
    ax.set_ylabel(unit, fontsize=7)
    ax.tick_params(labelsize=6)
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=5.5, loc="upper left", ncol=2, frameon=False)


def render(board: dict[str, Any], records: list[dict[str, Any]], out: Path) -> Path:
    """One PNG: each panel at its gridPos; rows as headings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_id = {r["id"]: r for r in records}
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    fig = plt.figure(figsize=(16, bottom * 0.38))
    start = min(r["start"] for r in records)
    when = datetime.fromtimestamp(start, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    fig.suptitle(f"{board['title']} — real Prometheus data ({when}); x: seconds from start", fontsize=12)
    for panel in board["panels"]:
        g = panel["gridPos"]
        top = 1 - (g["y"] / bottom) * 0.93 - 0.05
        if panel["type"] == "row":
            fig.text(0.01, top - 0.005, panel["title"], fontsize=11, weight="bold", va="top")
            continue
        height = g["h"] / bottom * 0.93
        ax = fig.add_axes((g["x"] / 24 + 0.035, top - height + 0.035, g["w"] / 24 - 0.05, height - 0.065))
        record = by_id.get(panel["id"])
        if record is None:
            ax.text(0.5, 0.5, "no data recorded", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(panel["title"], fontsize=9, loc="left")
            continue
        _plot_panel(ax, record, start)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render dashboards from recorded panel query results.")
    parser.add_argument("data", type=Path, help="directory of <uid>.jsonl files (PDPAIR_DASHBOARD_DATA)")
    parser.add_argument("out", type=Path, help="output directory for <uid>.png")
    args = parser.parse_args(argv)
    rendered = 0
    for build in DASHBOARDS.values():
        board = build()
        path = args.data / f"{board['uid']}.jsonl"
        if not path.exists():
            print(f"no data for {board['uid']} ({path})", file=sys.stderr)
            continue
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        print(render(board, records, args.out / f"{board['uid']}.png"))
        rendered += 1
    return 0 if rendered else 1


if __name__ == "__main__":
    sys.exit(main())
