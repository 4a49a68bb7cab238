"""The planner's fast paths against the plain ones: the interleaved-word runs against
``contiguous_runs``, the one-buffer range check against per-side checks, and a Qwen3-Next-like plan
expanded page by page against the naive per-page writes."""

from __future__ import annotations

import numpy as np
import pytest

from dataplane.errors import PlanError
from dataplane.planner import PeerLayout, RequestIndices, contiguous_runs, plan_request
from dataplane.planner.runs import interleaved, word_runs
from dataplane.schema.profiles import profile

QWEN = profile("qwen3-next")
LOCAL = QWEN.schema(pool_pages=256, max_requests=8)
PEER = PeerLayout.from_schema(QWEN.schema(pool_pages=128, max_requests=8))


def test_word_runs_match_contiguous_runs() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        n = int(rng.integers(1, 48))
        sides = []
        for _side in range(2):
            if rng.random() < 0.5:
                arr = np.arange(n) + int(rng.integers(0, 2**31 - 64))
                arr[rng.integers(0, n)] += int(rng.integers(0, 3))
            else:
                arr = rng.integers(0, 2**31 - 1, n)
            sides.append(arr.astype(np.int32))
        starts, lengths = word_runs(interleaved(*sides))
        s, d, ln = contiguous_runs(*sides)
        assert starts[:, 0].tolist() == s.tolist()
        assert starts[:, 1].tolist() == d.tolist()
        assert lengths.tolist() == ln.tolist()


def _per_page(plan_rows: list[tuple[int, int, int, int, int, int]], item: int) -> set[tuple[int, ...]]:
    """Each KV write split into its pages: (local region, src page, remote region, dst page)."""
    out = set()
    for lr, lo, rr, ro, size, comp in plan_rows:
        if comp == -1:
            out.update((lr, (lo + k) // item, rr, (ro + k) // item) for k in range(0, size, item))
    return out


def test_qwen_plan_matches_naive_pages() -> None:
    rng = np.random.default_rng(3)
    src = rng.permutation(256)[:100].astype(np.int32)
    src[10:30] = np.arange(200, 220)
    dst = rng.permutation(128)[:100].astype(np.int32)
    dst[10:30] = np.arange(50, 70)
    req = RequestIndices(src, dst, 1, 2, [np.array([3], np.int32)], [np.array([4], np.int32)])
    plan = plan_request(LOCAL, PEER, req)
    item = LOCAL.kv.item_len
    pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
    naive = {(b, s, b, d) for b in range(len(LOCAL.kv.layer_ids)) for s, d in pairs}
    assert _per_page(plan.rows(), item) == naive
    assert plan.writes_by_component()[0] == sum(len(c.tensors) for c in LOCAL.components[:1])
    assert plan.writes_by_component()[-2] == len(LOCAL.aux.item_lens)


@pytest.mark.parametrize(
    ("src", "dst", "side"),
    [
        ([0, 1, 200], [0, 1, 2], None),
        ([0, 1, 2], [0, 1, 128], "decode"),
        ([0, -1, 2], [0, 1, 2], "prefill"),
        ([0, 1, 256], [0, 1, 2], "prefill"),
        ([0, 1, 2], [-5, 1, 2], "decode"),
    ],
)
def test_one_buffer_range_check_names_the_side(src: list[int], dst: list[int], side: str | None) -> None:
    """Index 200 is beyond the decode side's limit (128) but valid on prefill (256): it passes."""
    req = RequestIndices(np.array(src, np.int32), np.array(dst, np.int32))
    if side is None:
        assert len(plan_request(LOCAL, PEER, req)) > 0
        return
    with pytest.raises(PlanError, match=side):
        plan_request(LOCAL, PEER, req)


def test_wide_indices_are_not_truncated() -> None:
    """An int64 index that would wrap to a valid int32 is still refused."""
    req = RequestIndices(np.array([0, 1, 2**32 + 3], np.int64), np.array([0, 1, 2], np.int32))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="prefill"):
        plan_request(LOCAL, PEER, req)
