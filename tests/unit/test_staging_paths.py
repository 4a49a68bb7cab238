"""The direct-or-staged decision: per component from mean write size, per request, forced."""

from __future__ import annotations

import math

import numpy as np

from dataplane.planner import WritePlan
from dataplane.staging import DEFAULT_THRESHOLD, choose_paths


def plan(sizes: dict[int, list[int]]) -> WritePlan:
    comp = np.concatenate([np.full(len(v), c) for c, v in sizes.items()])
    size = np.concatenate([np.asarray(v) for v in sizes.values()])
    at = np.arange(len(size)) * (1 << 22)
    return WritePlan.build(0, at, 0, at, size, comp)


def test_small_pages_are_staged_large_blocks_go_direct() -> None:
    p = plan({-1: [64 << 10] * 8, 0: [2 << 20, 48 << 10], -2: [64]})
    choice = choose_paths(p)
    assert choice.paths == {-2: "staged", -1: "staged", 0: "direct"}
    assert choice.staged_components == (-2, -1)
    assert len(choice.staged) == 9 and len(choice.direct) == 2
    assert choice.staged.total_bytes + choice.direct.total_bytes == p.total_bytes
    assert set(choice.direct.component.tolist()) == {0}


def test_threshold_is_on_the_mean_write_and_exclusive() -> None:
    p = plan({-1: [DEFAULT_THRESHOLD] * 3})
    assert choose_paths(p).paths == {-1: "direct"}
    assert choose_paths(p, DEFAULT_THRESHOLD + 1).paths == {-1: "staged"}


def test_per_request_decides_once_for_every_component() -> None:
    p = plan({-1: [4 << 10] * 100, 0: [2 << 20]})
    assert choose_paths(p, per_request=True).paths == {-1: "staged", 0: "staged"}
    assert choose_paths(p).paths == {-1: "staged", 0: "direct"}


def test_zero_disables_infinity_and_force_stage_everything() -> None:
    p = plan({-1: [4 << 10] * 4, 0: [1 << 30]})
    assert set(choose_paths(p, 0).paths.values()) == {"direct"}
    assert set(choose_paths(p, math.inf).paths.values()) == {"staged"}
    assert set(choose_paths(p, force="staged").paths.values()) == {"staged"}
    assert set(choose_paths(p, math.inf, force="direct").paths.values()) == {"direct"}


def test_empty_plan_has_no_paths() -> None:
    choice = choose_paths(WritePlan.empty())
    assert choice.paths == {} and len(choice.staged) == 0 and len(choice.direct) == 0
