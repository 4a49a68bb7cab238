"""The dashboards' conventions (DESIGN §7), checked on the built JSON: fixed uids, a datasource variable
every panel reads, ``rate()`` only over ``$__rate_interval``, variables from ``label_values()``, metric
names with the project's prefixes, and panels that stay inside the 24-column grid without overlapping."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dashboards import build
from dashboards.grafana import GRID_WIDTH, panels_of

BOARDS = {name: make() for name, make in build.DASHBOARDS.items()}
UIDS = {"pdpair-transfer.json": "pdpair-transfer", "pdpair-operator.json": "pdpair-operator"}


def exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels_of(board) for t in p["targets"]]


@pytest.mark.parametrize("name", BOARDS)
def test_uid_is_fixed_and_datasource_is_a_variable(name: str) -> None:
    board = BOARDS[name]
    assert board["uid"] == UIDS[name]
    (ds,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for panel in panels_of(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


@pytest.mark.parametrize("name", BOARDS)
def test_every_range_is_the_rate_interval(name: str) -> None:
    for expr in exprs(BOARDS[name]):
        assert re.findall(r"\[([^\]]+)\]", expr) in ([], ["$__rate_interval"]), expr
        assert ("rate(" in expr) == ("[$__rate_interval]" in expr), expr


@pytest.mark.parametrize("name", BOARDS)
def test_variables_come_from_label_values_and_are_used(name: str) -> None:
    board = BOARDS[name]
    queries = [v for v in board["templating"]["list"] if v["type"] == "query"]
    assert queries
    text = " ".join(exprs(board))
    for var in queries:
        assert re.fullmatch(r"label_values\(.+, \w+\)", var["query"]["query"]), var
        assert var["includeAll"] and var["allValue"] == ".*"
        assert f"${var['name']}" in text, f"variable {var['name']} is never used"


@pytest.mark.parametrize("name", BOARDS)
def test_metric_names_carry_the_project_prefix(name: str) -> None:
    for expr in exprs(BOARDS[name]):
        names = set(re.findall(r"\b(pdpair_\w+)", expr))
        assert names and all(n.startswith(("pdpair_agent_", "pdpair_operator_")) for n in names), expr


@pytest.mark.parametrize("name", BOARDS)
def test_panels_fit_the_grid_without_overlap(name: str) -> None:
    cells: set[tuple[int, int]] = set()
    ids = [p["id"] for p in BOARDS[name]["panels"]]
    assert len(ids) == len(set(ids))
    for panel in BOARDS[name]["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= GRID_WIDTH
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, panel["title"]
        cells |= mine
