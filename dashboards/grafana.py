"""Tiny builders for Grafana dashboard JSON (schemaVersion 39): variables, rows, time-series panels.

Only what PDPair's dashboards use, so the output stays reviewable: every panel reads the
``${datasource}`` variable, every query variable is ``label_values()`` with an All option (``.*``),
and panels are laid out left to right in a 24-column grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
GRID_WIDTH = 24


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A time-series panel; ``width`` in grid columns (of 24), ``unit`` a Grafana unit id."""

    title: str
    targets: tuple[Target, ...]
    unit: str
    description: str
    width: int = 12
    kind: str = "timeseries"


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
        "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False,
    }


def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    """A multi-value variable filled by ``label_values()``, with All meaning the regex ``.*``."""
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-values", "qryType": 1},
        "refresh": 2, "sort": 1, "includeAll": True, "allValue": ".*", "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0, "regex": "",
    }


def _panel_json(panel: Panel, panel_id: int, x: int, y: int, height: int) -> dict[str, Any]:
    return {
        "id": panel_id, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "min": 0, "custom": {"lineWidth": 1, "fillOpacity": 10}},
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom",
                       "calcs": ["mean", "max", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": t.expr, "legendFormat": t.legend,
             "range": True, "instant": False}
            for i, t in enumerate(panel.targets)
        ],
    }


def layout(rows: tuple[Row, ...], height: int = 8) -> list[dict[str, Any]]:
    """Rows and their panels with ids and grid positions, wrapping at the grid width."""
    out: list[dict[str, Any]] = []
    y, next_id = 0, 1
    for row in rows:
        out.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False,
                    "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}, "panels": []})
        next_id, y, x = next_id + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y = 0, y + height
            out.append(_panel_json(panel, next_id, x, y, height))
            next_id, x = next_id + 1, x + panel.width
        y += height
    return out


def dashboard(uid: str, title: str, description: str, variables: list[dict[str, Any]],
              rows: tuple[Row, ...]) -> dict[str, Any]:
    """A whole dashboard with a fixed ``uid`` (so links and provisioning stay stable)."""
    return {
        "uid": uid, "title": title, "description": description, "tags": ["pdpair"],
        "editable": True, "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1,
        "refresh": "30s", "time": {"from": "now-1h", "to": "now"}, "timezone": "browser",
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": layout(rows),
    }


def panels_of(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every non-row panel of a dashboard (the ones with queries)."""
    return [p for p in board["panels"] if p["type"] != "row"]
