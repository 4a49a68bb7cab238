"""The planner's fast paths against the plain ones: the interleaved-word runs against
``contiguous_runs``, the one-buffer range check against per-side checks, a Qwen3-Next-like plan
expanded page by page against the naive per-page writes, and the common-shape pass (the compiled
kernel where numba is installed, and the numpy path) against the general path (same rows; anything
it does not cover left to the general path)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.errors import PlanError
from dataplane.planner import (
    PeerLayout,
    RequestIndices,
    WritePlan,
    contiguous_runs,
    kernel,
    pairing_for,
    plan_request,
)
from dataplane.planner.pairing import Pairing
from dataplane.planner.request import plan_parts
from dataplane.planner.runs import interleaved, word_runs
from dataplane.schema import Component, KVSpec, RoleSchema, TensorSpec
from dataplane.schema.profiles import profile, profile_names

QWEN = profile("qwen3-next")
LOCAL = QWEN.schema(pool_pages=256, max_requests=8)
PEER = PeerLayout.from_schema(QWEN.schema(pool_pages=128, max_requests=8))
IMPLS = ["kernel", "numpy"]


def test_the_kernel_is_built() -> None:
    """numba is pinned in ``.[agent]``, which the suite installs: the kernel tests below run, never skip."""
    assert kernel.KERNEL is not None, "numba did not build the planner kernel; install .[agent]"


def _common(pr: Pairing, req: RequestIndices, impl: str) -> WritePlan | None:
    """The common-shape pass with the compiled kernel, or the numpy path."""
    assert pr.common is not None
    return pr.common.plan(req) if impl == "kernel" else pr.common.plan_numpy(req)


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


def _mla_with_sliced_mamba() -> tuple[RoleSchema, PeerLayout]:
    """MLA KV (whole pages at any TP) with a mamba component sliced TP 1 → 2: the common shape with
    based single rows."""
    kv = KVSpec(item_len=1152, num_pages=64, layer_ids=(0, 1, 2), layout="mla")
    mamba = (TensorSpec(4096, 1, tp_dim=64), TensorSpec(8192, 1, tp_dim=32), TensorSpec(4096, 2, tp_dim=64))
    half = tuple(TensorSpec(t.item_len // 2, t.layer_id, tp_dim=t.tp_dim // 2) for t in mamba)
    local = RoleSchema(
        model="m", tp_size=1, tp_rank=0, kv=kv, components=(Component("mamba", "mamba", mamba, num_items=8),)
    )
    peer = RoleSchema(
        model="m",
        tp_size=2,
        tp_rank=1,
        kv=msgspec.structs.replace(kv, num_pages=48),
        components=(Component("mamba", "mamba", half, num_items=6),),
    )
    return local, PeerLayout.from_schema(peer)


def _cases() -> list[tuple[str, RoleSchema, PeerLayout]]:
    out = []
    for name in profile_names():
        local = profile(name).schema(pool_pages=64, max_requests=8)
        out.append((name, local, PeerLayout.from_schema(profile(name).schema(pool_pages=48, max_requests=6))))
    return [*out, ("mla+sliced mamba", *_mla_with_sliced_mamba())]


def _random_request(rng: np.random.Generator, local: RoleSchema, peer: PeerLayout) -> RequestIndices:
    n, pages = int(rng.integers(1, 40)), min(local.kv.num_pages, *(r.num_items for r in peer.kv))
    src, dst = rng.permutation(pages)[:n], rng.permutation(pages)[:n]
    if rng.random() < 0.5:  # dense sorted pages: long shared runs, broken where either side skips
        src, dst = np.sort(src), np.sort(dst)
    slots = [
        (int(rng.integers(0, c.num_items)), int(rng.integers(0, min(r.num_items for r in pc.regions))))
        for c, pc in zip(local.components, peer.components, strict=True)
    ]
    return RequestIndices(
        src.astype(np.int32),
        dst.astype(np.int32),
        int(rng.integers(0, local.aux.num_items)),
        int(rng.integers(0, min(r.num_items for r in peer.aux))),
        [np.array([s], np.int32) for s, _ in slots],
        [np.array([d], np.int32) for _, d in slots],
    )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_common_shape_writes_what_the_general_path_writes(
    case: tuple[str, RoleSchema, PeerLayout], impl: str
) -> None:
    """Same rows, same order, same dtypes, every column a contiguous array of its own length."""
    _, local, peer = case
    pr = pairing_for(local, peer)
    assert pr.common is not None
    rng = np.random.default_rng(11)
    for _ in range(200):
        req = _random_request(rng, local, peer)
        fast = _common(pr, req, impl)
        assert fast is not None
        general = plan_parts(pr, req)
        fast.check()
        assert fast.rows() == general.rows()
        assert all(getattr(fast, f).flags.c_contiguous for f in ("local_offset", "size", "component"))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_one_page_request_takes_the_common_shape(impl: str) -> None:
    """A room of one page (a prompt within one page; every room of the 4 KiB benchmark) is one run
    of length one: the one-pass path writes exactly the general path's rows for it."""
    pr = pairing_for(LOCAL, PEER)
    rng = np.random.default_rng(9)
    for _ in range(20):
        base = _random_request(rng, LOCAL, PEER)
        one = replace(base, src_kv=base.src_kv[:1], dst_kv=base.dst_kv[:1])
        fast = _common(pr, one, impl)
        assert fast is not None
        assert fast.rows() == plan_parts(pr, one).rows()


@pytest.mark.parametrize("impl", IMPLS)
def test_common_shape_declines_what_it_does_not_cover(impl: str) -> None:
    """Each of these goes to the general path, which plans it (or raises) exactly as before."""
    pr = pairing_for(LOCAL, PEER)
    assert pr.common is not None
    base = _random_request(np.random.default_rng(5), LOCAL, PEER)
    src, dst = base.src_kv, base.dst_kv
    declined = [
        replace(base, dst_kv=dst[:-1]),  # one-page drift
        replace(base, src_kv=src.astype(np.int64)),  # not int32
        replace(base, dst_kv=dst.astype(np.int64)),
        replace(base, dst_kv=dst.astype(">i4")),  # not native
        replace(base, src_kv=src.reshape(-1, 1)),  # not 1-D
        replace(base, src_aux=None, dst_aux=None),  # no aux
        replace(base, dst_state=[np.array([1, 2], np.int32)]),  # several state indices
        replace(base, src_state=[None]),  # a component skipped
        replace(base, src_kv=np.concatenate((src[:-1], [200])).astype(np.int32)),  # valid on prefill only
    ]
    for req in declined:
        assert _common(pr, req, impl) is None
    assert len(plan_request(LOCAL, PEER, declined[0])) == len(plan_parts(pr, declined[0]))
    for bad, side in (
        (replace(base, dst_aux=PEER.aux[0].num_items), "aux"),
        (replace(base, src_state=[np.array([-1], np.int32)]), "prefill"),
        (replace(base, src_state=[np.array([LOCAL.components[0].num_items], np.int32)]), "prefill"),
        (replace(base, dst_state=[np.array([PEER.components[0].regions[0].num_items], np.int32)]), "decode"),
        (replace(base, dst_state=[np.array([-1], np.int32)]), "decode"),
        (replace(base, dst_kv=np.concatenate((dst[:-1], [128])).astype(np.int32)), "decode"),
    ):
        assert _common(pr, bad, impl) is None
        with pytest.raises(PlanError, match=side):
            plan_request(LOCAL, PEER, bad)


@pytest.mark.parametrize("impl", IMPLS)
def test_state_slots_of_other_integer_dtypes_take_the_common_shape(impl: str) -> None:
    """One-slot state arrays of another integer dtype (an engine's int64, a big-endian frame) are
    planned in one pass too, with the rows of the int32 ones."""
    pr = pairing_for(LOCAL, PEER)
    base = _random_request(np.random.default_rng(11), LOCAL, PEER)
    assert base.src_state is not None and base.dst_state is not None
    expected = plan_parts(pr, base).rows()
    for dtype in (np.int64, np.dtype(">i4"), np.uint16):
        req = replace(
            base,
            src_state=[np.asarray(s).astype(dtype) for s in base.src_state],
            dst_state=[np.asarray(d).astype(dtype) for d in base.dst_state],
        )
        got = _common(pr, req, impl)
        assert got is not None and got.rows() == expected


@pytest.mark.parametrize("impl", IMPLS)
def test_decoded_metadata_takes_the_common_shape(impl: str) -> None:
    """What the agent's prefill side plans from (``decode_metadata`` → ``RequestIndices``) has the
    common shape: the decoded arrays (int32, contiguous, writeable, native order) take the one-pass
    path, which writes what the general path writes."""
    from dataplane.codec import TransferMetadata, decode_metadata, encode_metadata

    rng = np.random.default_rng(11)
    src = rng.permutation(PEER.kv[0].num_items)[:40].astype(np.int32)
    dst = rng.permutation(PEER.kv[0].num_items)[:40].astype(np.int32)
    md = decode_metadata(
        encode_metadata(
            TransferMetadata(
                room=7,
                endpoint="10.0.0.2",
                dst_port=4000,
                engine_key="decode-0",
                dst_kv_indices=dst,
                dst_aux_index=2,
                dst_state_indices=(np.array([5], np.int32),),
            )
        )
    )
    req = RequestIndices(
        src, md.dst_kv_indices, 1, md.dst_aux_index, [np.array([3], np.int32)], list(md.dst_state_indices)
    )
    pr = pairing_for(LOCAL, PEER)
    assert pr.common is not None
    fast = _common(pr, req, impl)
    assert fast is not None
    assert fast.rows() == plan_parts(pr, req).rows()
    assert req == replace(req) and req.dst_kv is md.dst_kv_indices


_EDGE = [-(2**31), -2, -1, 0, 1, 126, 127, 128, 129, 255, 256, 2**31 - 2, 2**31 - 1]


@st.composite
def _pages(draw: st.DrawFn, n: int) -> list[int]:
    """``n`` page indices in runs of consecutive pages: in half the examples every run starts inside
    the smallest pool (48 pages) though it may run past its end; in the rest, runs may also start at
    an edge value (negative, around a limit, at int32's ends) or anywhere in int32."""
    valid = st.integers(0, 47)
    starts = valid
    if draw(st.booleans()):
        starts = st.one_of(valid, st.sampled_from(_EDGE), st.integers(-(2**31), 2**31 - 1))
    out: list[int] = []
    while len(out) < n:
        start, run = draw(starts), draw(st.integers(1, 6))
        out += [min(max(start + k, -(2**31)), 2**31 - 1) for k in range(run)]
    return out[:n]


@st.composite
def _kv_requests(draw: st.DrawFn) -> tuple[str, RequestIndices]:
    name, local, peer = draw(st.sampled_from(_cases()))
    n = draw(st.integers(2, 40))
    src, dst = draw(_pages(n)), draw(_pages(n))
    base = _random_request(np.random.default_rng(draw(st.integers(0, 2**16))), local, peer)
    return name, replace(base, src_kv=np.array(src, np.int32), dst_kv=np.array(dst, np.int32))


@settings(max_examples=300, deadline=None)
@given(_kv_requests())
def test_kernel_agrees_with_numpy_and_the_general_path(case: tuple[str, RequestIndices]) -> None:
    """On any int32 pages (negative, beyond either side's limit, runs crossing a limit or int32's
    ends): the kernel and the numpy path both decline, or both write the general path's rows; a
    declined request is planned or refused by the general path alone."""
    name, req = case
    local, peer = next((c[1], c[2]) for c in _cases() if c[0] == name)
    pr = pairing_for(local, peer)
    assert pr.common is not None
    compiled, plain = pr.common.plan(req), pr.common.plan_numpy(req)
    assert (compiled is None) == (plain is None)
    try:
        general = plan_parts(pr, req).rows()
    except PlanError:
        assert compiled is None
        return
    if compiled is not None and plain is not None:
        compiled.check()
        assert compiled.rows() == plain.rows() == general
        assert all(getattr(compiled, f).flags.c_contiguous for f in ("local_offset", "size", "component"))


def test_kernel_takes_strided_and_read_only_pages() -> None:
    """Views with a stride and read-only arrays (e.g. ``frombuffer`` of a frame) plan the same rows."""
    pr = pairing_for(LOCAL, PEER)
    assert pr.common is not None
    base = _random_request(np.random.default_rng(9), LOCAL, PEER)
    src2, dst2 = np.repeat(base.src_kv, 2)[::2], np.repeat(base.dst_kv, 2)[::2]
    ro = base.dst_kv.copy()
    ro.setflags(write=False)
    expected = plan_parts(pr, base).rows()
    for req in (replace(base, src_kv=src2, dst_kv=dst2), replace(base, dst_kv=ro)):
        got = pr.common.plan(req)
        assert got is not None and got.rows() == expected


def test_kernel_is_called_past_numba_dispatch() -> None:
    """The plan calls the kernel's compiled entry point, not numba's dispatcher (whose type matching
    ``CommonShape.plan`` does itself, for the pages); an object without one compiled signature is
    called as it is."""
    assert not hasattr(kernel.KERNEL, "overloads")
    dispatcher = kernel.compiled(kernel._source, kernel._signature, kernel.ENV)[0]
    assert kernel.entry_point(dispatcher) is not dispatcher
    assert kernel.entry_point(kernel._source) is kernel._source


def _describe(env: dict[str, str]) -> str:
    code = "from dataplane.planner import kernel; print(kernel.describe())"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_kernel_can_be_switched_off() -> None:
    """``PDPAIR_PLANNER_KERNEL=0`` leaves the numpy path (as does a missing numba)."""
    assert _describe({kernel.ENV: "0"}) == f"numpy ({kernel.ENV}=0)"
    assert kernel.describe().startswith("numba ")


def test_kernel_compiles_without_a_cache_where_none_is_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba refuses ``cache=True`` (RuntimeError) when no cache location is writable: the kernel is
    then compiled in memory; any other failure leaves the numpy path (and says why)."""
    import types

    def fake_numba(fail: Exception | None) -> types.SimpleNamespace:
        real = pytest.importorskip("numba")
        calls: list[bool] = []

        def njit(sig: object, *, cache: bool, **_: object) -> object:
            calls.append(cache)
            if cache and fail is None:
                raise RuntimeError("cannot cache function: no locator available")
            if fail is not None:
                raise fail
            return lambda fn: fn

        return types.SimpleNamespace(njit=njit, types=real.types, calls=calls)

    monkeypatch.setattr(kernel, "_WHY_NOT", kernel._WHY_NOT)  # restored afterwards
    no_cache = fake_numba(None)
    monkeypatch.setitem(sys.modules, "numba", no_cache)
    assert kernel._compile() is kernel._source
    assert no_cache.calls == [True, False]
    monkeypatch.setitem(sys.modules, "numba", fake_numba(ValueError("boom")))
    assert kernel._compile() is None
    assert kernel._WHY_NOT == "kernel failed to compile: ValueError"
