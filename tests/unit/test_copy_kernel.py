"""The ``cuda-ipc`` copy kernel's host side (``transports.copy_kernel``), on CPU: the packed table and
the launch geometry, replayed program by program by the kernel's numpy twin, must move exactly the
writes' bytes and nothing else, and flag the first write outside its regions; plus the compiled bounds
check (``batch_kernels``, numba) against its numpy twin. The kernel itself runs in
``tests/integration/test_cuda_ipc.py`` (GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.errors import PlanError
from dataplane.transports.base import Writes, check_bounds, write_error
from dataplane.transports.batch_kernels import FIRST_BAD
from dataplane.transports.copy_kernel import BLOCKS, MIN_CHUNK, PROGRAMS, geometry, pack, region_table, replay


@st.composite
def batches(draw: st.DrawFn) -> tuple[Writes, list[int], list[int]]:
    """Writes between a few regions on each side (sizes and offsets at some alignment), destinations
    never overlapping, so the result is independent of order."""
    align = draw(st.sampled_from([1, 2, 8, 16, 4096]))
    nl, nr = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    count = draw(st.integers(1, 30))
    sizes = [max(align, draw(st.integers(1, 3 << 18)) // align * align) for _ in range(count)]
    lr = [draw(st.integers(0, nl - 1)) for _ in range(count)]
    lo = [draw(st.integers(0, 4)) * align for _ in range(count)]
    rr, ro, ends = [], [], [0] * nr
    for size in sizes:
        r = draw(st.integers(0, nr - 1))
        rr.append(r)
        ro.append(ends[r] + draw(st.integers(0, 2)) * align)
        ends[r] = ro[-1] + size
    ends_l = [[o + s for o, s, r in zip(lo, sizes, lr, strict=True) if r == k] for k in range(nl)]
    lsizes = [max(e or [16]) for e in ends_l]
    rsizes = [max(e, 16) for e in ends]
    w = Writes(np.array(lr, np.int32), np.array(lo, np.int64), np.array(rr, np.int32), np.array(ro, np.int64),
               np.array(sizes, np.int64))
    return w, lsizes, rsizes


def layout(sizes: list[int], gap: int) -> tuple[np.ndarray, np.ndarray]:
    """Regions one after another from a base, ``gap`` bytes apart: (offsets, sizes)."""
    offs = np.cumsum([0] + [s + gap for s in sizes[:-1]])
    return offs.astype(np.int64), np.array(sizes, np.int64)


def run(w: Writes, lsizes: list[int], rsizes: list[int], gap: int = 32) -> tuple[int, np.ndarray, np.ndarray]:
    loff, lsz = layout(lsizes, gap)
    roff, rsz = layout(rsizes, gap)
    src = np.random.default_rng(1).integers(0, 256, int(loff[-1] + lsz[-1] + gap), dtype=np.uint8)
    dst = np.zeros(int(roff[-1] + rsz[-1] + gap), np.uint8)
    g = geometry(len(w), int(w.size.sum()), int(w.size.max()))
    flag = replay(pack(w), region_table(loff, lsz, roff, rsz), len(lsizes), src, dst, g)
    want = np.zeros_like(dst)
    rows = zip(w.local_region, w.local_offset, w.remote_region, w.remote_offset, w.size, strict=True)
    for a, o, b, p, n in rows:
        if write_error(0, int(a), int(o), int(b), int(p), int(n), lsizes, rsizes) is None:
            want[roff[b] + p : roff[b] + p + n] = src[loff[a] + o : loff[a] + o + n]
    return flag, dst, want


@settings(max_examples=80, deadline=None)
@given(batches())
def test_every_write_moves_exactly_its_bytes(batch: tuple[Writes, list[int], list[int]]) -> None:
    w, lsizes, rsizes = batch
    flag, dst, want = run(w, lsizes, rsizes)
    assert flag == len(w)
    assert np.array_equal(dst, want)


def test_the_first_write_outside_its_regions_is_flagged_and_skipped_and_the_rest_land() -> None:
    n = 40
    at = np.arange(n, dtype=np.int64) * 64
    w = Writes(np.zeros(n, np.int32), at, np.zeros(n, np.int32), at, np.full(n, 64, np.int64))
    sizes = [n * 64]
    for field, row, value in (("remote_offset", 37, n * 64 - 32), ("remote_region", 11, 1),
                              ("size", 5, 0), ("local_offset", 20, -64)):
        bad = Writes(*(getattr(w, f).copy() for f in ("local_region", "local_offset", "remote_region",
                                                      "remote_offset", "size")))
        getattr(bad, field)[row] = value
        if field == "remote_offset":
            bad.remote_offset[3] = n * 64  # a second bad write, after the first: the flag names the first
        flag, dst, want = run(bad, sizes, sizes)
        assert flag == (3 if field == "remote_offset" else row)
        assert np.array_equal(dst, want)  # the others landed, the bad ones wrote nothing
        assert write_error(flag, *(int(getattr(bad, f)[flag]) for f in (
            "local_region", "local_offset", "remote_region", "remote_offset", "size")), sizes, sizes)


def test_a_few_huge_writes_are_cut_to_fill_the_gpu_and_many_pages_launch_one_program_each() -> None:
    huge = geometry(16, 16 << 26, 64 << 20)
    assert huge.grid == (16, 64) and huge.chunk == 1 << 20 and huge.block == BLOCKS[-1] and huge.warps == 16
    pages = geometry(16384, 16384 * 4096, 4096)
    assert pages.grid == (16384, 1) and pages.block == 512
    one = geometry(1, 64, 64)
    assert one.grid == (1, 1) and one.chunk == MIN_CHUNK and one.block == BLOCKS[0]
    for n, largest in ((1, 1 << 40), (3, 5 << 30), (PROGRAMS, 1 << 30)):
        g = geometry(n, n * largest, largest)
        assert g.grid[1] * g.chunk >= largest and g.grid[1] <= 65535
        assert g.grid[0] * g.grid[1] <= max(n, 2 * PROGRAMS)


def test_the_table_is_one_upload_with_the_flag_first() -> None:
    w = Writes(np.array([1, 0], np.int32), np.array([8, 16]), np.array([0, 2], np.int32), np.array([32, 48]),
               np.array([64, 128]))
    assert pack(w).tolist() == [2, 1, 0, 8, 16, 0, 2, 32, 48, 64, 128]


def test_compiled_bounds_check_finds_what_the_numpy_path_reports() -> None:
    n = 100
    at = np.arange(n) * 64
    ok = Writes(np.zeros(n, np.int32), at, np.ones(n, np.int32), at, np.full(n, 64))
    sizes = np.array([n * 64, n * 64], dtype=np.int64)
    check_bounds(ok, sizes, sizes)
    bad = Writes(ok.local_region, ok.local_offset, ok.remote_region, ok.remote_offset.copy(), ok.size)
    bad.remote_offset[37] = n * 64 - 32
    with pytest.raises(PlanError, match="write 37: remote region 1"):
        check_bounds(bad, sizes, sizes)
    if FIRST_BAD is not None:
        assert FIRST_BAD(*(getattr(bad, f) for f in ("local_region", "local_offset", "remote_region",
                                                       "remote_offset", "size")), sizes, sizes) == 37
