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
from dataplane.transports.copy_kernel import (
    BLOCKS,
    MIN_CHUNK,
    PROGRAMS,
    STRIDED_CHUNK,
    geometry,
    pack,
    region_table,
    replay,
    strided_geometry,
)


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


@st.composite
def strided_batches(draw: st.DrawFn) -> tuple[Writes, list[int], list[int]]:
    """Strided entries (``Writes.repeat``: head slices of runs of tokens) between two regions, each
    entry's writes ``stride >= size`` apart, destinations never overlapping."""
    align = draw(st.sampled_from([1, 8, 16]))
    n = draw(st.integers(1, 12))
    lo, ro, size, count, ls, rs = [], [], [], [], [], []
    end = 0
    for _ in range(n):
        size.append(draw(st.integers(1, 96)) * align)
        count.append(draw(st.integers(1, 300)))
        ls.append(size[-1] + draw(st.integers(0, 3)) * align)
        rs.append(size[-1] + draw(st.integers(0, 3)) * align)
        lo.append(draw(st.integers(0, 8)) * align)
        ro.append(end + draw(st.integers(0, 2)) * align)
        end = ro[-1] + (count[-1] - 1) * rs[-1] + size[-1]
    lsize = max(o + (c - 1) * st_ + s for o, c, st_, s in zip(lo, count, ls, size, strict=True))
    i64 = np.array
    w = Writes(np.zeros(n, np.int32), i64(lo, np.int64), np.zeros(n, np.int32), i64(ro, np.int64),
               i64(size, np.int64), i64([count, ls, rs], np.int64))
    return w, [lsize], [end]


def _replay(w: Writes, lsizes: list[int], rsizes: list[int]) -> tuple[int, np.ndarray, np.ndarray]:
    """The kernel's numpy twin on a strided batch with its strided geometry, and the expanded batch's
    bytes written one by one."""
    loff, lsz = layout(lsizes, 32)
    roff, rsz = layout(rsizes, 32)
    src = np.random.default_rng(2).integers(0, 256, int(loff[-1] + lsz[-1] + 32), dtype=np.uint8)
    dst = np.zeros(int(roff[-1] + rsz[-1] + 32), np.uint8)
    assert w.repeat is not None
    g = strided_geometry(w.size, w.repeat[0])
    flag = replay(pack(w), region_table(loff, lsz, roff, rsz), len(lsizes), src, dst, g)
    want = np.zeros_like(dst)
    for a, o, b, p, k in zip(*w.expanded().lists, strict=True):
        want[roff[b] + p : roff[b] + p + k] = src[loff[a] + o : loff[a] + o + k]
    return flag, dst, want


@settings(max_examples=60, deadline=None)
@given(strided_batches())
def test_strided_entries_move_exactly_the_bytes_of_their_writes(
    batch: tuple[Writes, list[int], list[int]],
) -> None:
    w, lsizes, rsizes = batch
    flag, dst, want = _replay(w, lsizes, rsizes)
    assert flag == len(w)
    assert np.array_equal(dst, want)


def test_a_strided_entry_whose_last_write_leaves_its_region_is_flagged_and_skipped() -> None:
    n, count = 4, 16
    at = np.arange(n, dtype=np.int64) * count * 128
    rep = np.array([[count] * n, [128] * n, [128] * n], np.int64)
    w = Writes(np.zeros(n, np.int32), at, np.zeros(n, np.int32), at, np.full(n, 64, np.int64), rep)
    sizes = [n * count * 128]
    flag, _, want = _replay(w, sizes, sizes)
    assert flag == n
    bad = Writes(w.local_region, w.local_offset, w.remote_region, w.remote_offset, w.size, rep.copy())
    assert bad.repeat is not None
    bad.repeat[0, 3] = count + 1  # the entry's first write is inside its regions, its 17th is not
    loff, lsz = layout(sizes, 32)
    src = np.random.default_rng(2).integers(0, 256, int(loff[-1] + lsz[-1] + 32), dtype=np.uint8)
    out = np.zeros_like(src)
    g = strided_geometry(bad.size, bad.repeat[0])
    assert replay(pack(bad), region_table(loff, lsz, loff, lsz), 1, src, out, g) == 3
    assert not out[3 * count * 128 :].any()  # nothing of the bad entry landed, the others did
    assert np.array_equal(out[: 3 * count * 128], want[: 3 * count * 128])
    with pytest.raises(PlanError, match="write 3: local region 0"):
        check_bounds(bad, np.array(sizes), np.array(sizes))
    check_bounds(w, np.array(sizes), np.array(sizes))


def test_a_strided_batch_packs_three_more_columns_and_cuts_entries_into_whole_writes() -> None:
    w = Writes(np.array([0], np.int32), np.array([8]), np.array([1], np.int32), np.array([16]),
               np.array([512]), np.array([[1000], [1024], [2048]]))
    assert pack(w).tolist() == [1, 0, 8, 1, 16, 512, 1000, 1024, 2048]
    few = strided_geometry(w.size, w.repeat[0])  # type: ignore[index]
    assert few.per == 1 and few.chunk <= 512 and few.grid == (1, 1000)  # one write a program: 1000 programs
    assert few.block == 64  # a tile row per 512-byte write
    many = strided_geometry(np.array([512, 256]), np.array([1_000_000, 10]))
    assert many.chunk == STRIDED_CHUNK and many.grid == (2, -(-1_000_000 // (STRIDED_CHUNK // 512)))
    assert many.block == 64 and many.warps == 16
    mixed = strided_geometry(np.array([512, 1 << 20]), np.array([4096, 1]))
    assert mixed.block == 64  # fitted to the head slices; the state block is copied as a long write
    assert mixed.grid == (2, -(-4096 // (mixed.chunk // 512)))
    assert mixed.chunk < STRIDED_CHUNK  # a small batch: smaller programs, to fill the GPU
    assert w.expanded().count == w.count == 1000 and w.nbytes == 512 * 1000


def test_a_strided_batch_is_packed_and_measured_alike_compiled_and_in_numpy() -> None:
    from dataplane.transports.batch_kernels import PACK_STRIDED
    from dataplane.transports.copy_kernel import prepare_strided

    # numba is pinned in the agent's dependencies: the compiled pass must exist to be compared here
    assert PACK_STRIDED is not None, "numba (pinned in .[agent]) did not compile PACK_STRIDED"
    rng = np.random.default_rng(11)
    for n in (1, 3, 40, 3000):
        size = rng.choice([8, 100, 512, 1024, 6144, 1 << 20], n).astype(np.int64)
        count = rng.choice([1, 64, 960, 100_000], n).astype(np.int64)
        rep = np.stack([count, size * 2, size]).astype(np.int64)
        rep = np.asfortranarray(rep) if n == 40 else rep  # a mask's subset of a plan's columns is F-ordered
        w = Writes(rng.integers(0, 4, n).astype(np.int32), rng.integers(0, 1 << 30, n), rng.integers(0, 4, n)
                   .astype(np.int32), rng.integers(0, 1 << 30, n), size, rep)
        table, g = prepare_strided(w, lambda k: np.empty(k, np.int64))
        assert table.tolist() == pack(w).tolist()
        assert g == strided_geometry(w.size, count), n
