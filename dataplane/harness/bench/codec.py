"""``bench codec``: our codec + planner against sglang 0.5.23's own helpers, on the same inputs.

Scenario (DESIGN §8): a Qwen3-Next-like request — 32K tokens at page 64 → 512 KV pages fragmented into
runs of 1-16 pages, 48 layers of which every 4th is full attention (24 KV buffers) and the other 36 are
Gated DeltaNet (72 mamba tensors), one aux slot, one mamba slot. The TP-mismatched requests (KV head
slices per token, mamba slice blocks per tensor) run prefill TP 1 → decode TP 2 on that layout, and
TP 2 → 4 and TP 8 → 4 on the same layers with 8 KV heads (Qwen3-Next's 2 do not split 4 or 8 ways);
sglang's side is its MoRI sender's per-request work: one head-slice plan reused for every KV buffer
and each tensor's slice blocks. Each scenario times ours and sglang's
on identical inputs in the same process, pinned to one CPU: nine rounds of one batch per side, the
order within a round alternating, the garbage collector off during each timed batch (as ``timeit``
does). Each side's rate is its best round; the per-round ratios' spread is reported beside it.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from importlib import metadata
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

from ... import codec
from ...planner import (
    PeerLayout,
    RequestIndices,
    WritePlan,
    contiguous_runs,
    pairing_for,
    plan_request,
    slice_byte_blocks,
)
from ...planner import kernel as planner_kernel
from ...schema import RoleSchema
from ...schema.profiles import profile
from . import sglang_ref

PAGES, ROOM, SLOT = 512, 4242, 17


@dataclass(frozen=True)
class Result:
    """One scenario's rates. ``ours_per_s`` / ``sglang_per_s`` are each side's best round (as
    ``timeit`` recommends: the least disturbed); ``ratio`` is their quotient. ``ratios`` are the
    per-round quotients of the two sides' adjacent batches, whose spread shows how much the machine
    moved the figure; ``cpu`` is the CPU the process was pinned to (``None``: not pinned);
    ``planner`` says what planned the common request shape (the numba kernel or numpy)."""

    scenario: str
    ours_per_s: float
    sglang_per_s: float
    ratios: tuple[float, ...] = ()
    ours_median_per_s: float | None = None
    sglang_median_per_s: float | None = None
    cpu: int | None = None
    planner: str | None = None

    @property
    def ratio(self) -> float:
        return self.ours_per_s / self.sglang_per_s

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "ours_per_s": round(self.ours_per_s, 1),
            "sglang_per_s": round(self.sglang_per_s, 1),
            "ratio": round(self.ratio, 2),
        }
        if self.ratios:
            out.update(
                rounds=len(self.ratios),
                ratio_min=round(min(self.ratios), 2),
                ratio_median=round(statistics.median(self.ratios), 2),
                ratio_max=round(max(self.ratios), 2),
            )
        if self.ours_median_per_s is not None and self.sglang_median_per_s is not None:
            out.update(
                ours_median_per_s=round(self.ours_median_per_s, 1),
                sglang_median_per_s=round(self.sglang_median_per_s, 1),
            )
        if self.cpu is not None:
            out["cpu"] = self.cpu
        if self.planner is not None:
            out["planner"] = self.planner
        return out


def fragmented_pages(rng: np.random.Generator, n: int, pool: int) -> np.ndarray:
    """``n`` distinct page ids in runs of 1-16 consecutive pages, runs in random order."""
    lengths: list[int] = []
    while sum(lengths) < n:
        lengths.append(min(int(rng.integers(1, 17)), n - sum(lengths)))
    starts = rng.choice(np.arange(0, pool - 16, 17), size=len(lengths), replace=False)
    return np.concatenate([np.arange(s, s + k) for s, k in zip(starts, lengths, strict=True)]).astype(
        np.int32
    )


@dataclass(frozen=True)
class Timing:
    """Seconds per call of each side in each round (adjacent batches, same round)."""

    ours: tuple[float, ...]
    theirs: tuple[float, ...]

    def result(self, scenario: str, cpu: int | None = None, planner: str | None = None) -> Result:
        return Result(
            scenario,
            1 / min(self.ours),
            1 / min(self.theirs),
            tuple(t / o for o, t in zip(self.ours, self.theirs, strict=True)),
            1 / statistics.median(self.ours),
            1 / statistics.median(self.theirs),
            cpu,
            planner,
        )


def rates(
    ours: Callable[[], object],
    theirs: Callable[[], object],
    iterations: int,
    budget_s: float = 0.08,
    rounds: int = 9,
) -> Timing:
    """Both sides' time per call over ``rounds`` rounds of one batch each, with the order inside a
    round alternating (ours first, then theirs first, ...), so a change in the (shared) machine's
    speed, or the caches one side leaves behind, reaches both sides alike. Each side is warmed up
    and its batch size set to about ``budget_s`` (at most ``iterations`` calls) beforehand. As in
    ``timeit``, the garbage collector is off during each timed batch (and back on between them)."""
    n_ours, n_theirs = _batch(ours, iterations, budget_s), _batch(theirs, iterations, budget_s)
    t_ours: list[float] = []
    t_theirs: list[float] = []
    for r in range(rounds):
        if r % 2:
            t_theirs.append(_timed(theirs, n_theirs) / n_theirs)
            t_ours.append(_timed(ours, n_ours) / n_ours)
        else:
            t_ours.append(_timed(ours, n_ours) / n_ours)
            t_theirs.append(_timed(theirs, n_theirs) / n_theirs)
    return Timing(tuple(t_ours), tuple(t_theirs))


def _batch(fn: Callable[[], object], iterations: int, budget_s: float) -> int:
    """After a warm-up of at least three calls and about a tenth of ``budget_s``: how many calls fit
    in ``budget_s`` (at least one, at most ``iterations``)."""
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < budget_s / 10:
        fn()
        calls += 1
    per_call = _timed(fn, calls) / calls
    return max(1, min(iterations, int(budget_s / max(per_call, 1e-9))))


def _timed(fn: Callable[[], object], n: int) -> float:
    """Seconds for ``n`` calls, with the garbage collector off (as ``timeit`` does)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - start
    finally:
        if enabled:
            gc.enable()


def pin_to_one_cpu(cpu: int | None = None) -> int | None:
    """Pin this process to one CPU (``cpu``, or by default the highest-numbered one it may use, which
    is the least likely to take the machine's interrupts); the CPU pinned to, or ``None`` where the
    platform cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    chosen = max(allowed) if cpu is None else cpu
    os.sched_setaffinity(0, {chosen})
    return chosen


@dataclass
class Inputs:
    """The shared inputs, and sglang's view of the same (its ``self`` objects are plain namespaces)."""

    local: RoleSchema
    peer_schema: RoleSchema
    src_kv: np.ndarray
    dst_kv: np.ndarray

    @property
    def peer(self) -> PeerLayout:
        return PeerLayout.from_schema(self.peer_schema)

    @cached_property
    def state_lists(self) -> tuple[list[int], list[int], list[int]]:
        """Component 0's (item lens, layer ids) on this side and its layer ids on the peer's, as the
        plain lists sglang's sender holds in its ``kv_args`` from registration on (built once here:
        the schema's properties build them on every access, which is no part of sglang's per-request
        work)."""
        return (
            self.local.state_item_lens[0],
            self.local.state_layer_ids[0],
            self.peer_schema.state_layer_ids[0],
        )

    def request(self) -> RequestIndices:
        return RequestIndices(
            self.src_kv, self.dst_kv, 3, 5, [np.array([SLOT], np.int32)], [np.array([SLOT + 1], np.int32)]
        )

    def metadata(self) -> codec.TransferMetadata:
        return codec.TransferMetadata(
            room=ROOM,
            endpoint="127.0.0.1",
            dst_port=36001,
            engine_key="decode-0",
            dst_kv_indices=self.dst_kv,
            dst_aux_index=5,
            dst_state_indices=(np.array([SLOT + 1], np.int32),),
        )

    def registration(self) -> codec.Registration:
        s = self.peer_schema
        blob = b"\x9f" + b"\x00" * 180
        return codec.Registration(
            endpoint="127.0.0.1",
            dst_port=36001,
            engine_desc=b"\x96\xa8decode-0" + b"\x00" * 40,
            dst_kv_mem_descs=(blob,) * len(s.kv.layer_ids),
            dst_aux_mem_descs=(blob,),
            dst_state_mem_descs=tuple((blob,) * len(c.tensors) for c in s.components),
            decode_tp_size=s.tp_size,
            decode_tp_rank=s.tp_rank,
            dst_kv_item_len=s.kv.item_len,
            dst_state_item_lens=tuple(tuple(x) for x in s.state_item_lens),
            dst_state_dim_per_tensor=tuple(tuple(x) for x in s.state_dim_per_tensor),
            dst_state_layer_ids=tuple(tuple(x) for x in s.state_layer_ids),
            dst_kv_layer_ids=s.kv.layer_ids,
        )

    def sglang_receiver(self, ref: ModuleType) -> SimpleNamespace:
        reg, s = self.registration(), self.peer_schema
        kv_args = SimpleNamespace(
            gpu_id=0,
            engine_rank=s.tp_rank,
            kv_item_lens=[s.kv.item_len],
            state_item_lens=s.state_item_lens,
            state_dim_per_tensor=s.state_dim_per_tensor,
            state_layer_ids=s.state_layer_ids,
            kv_layer_ids=list(s.kv.layer_ids),
        )
        desc = ref.OpaqueDesc
        return SimpleNamespace(
            engine_desc=desc(reg.engine_desc, "decode-0"),
            kv_mem_descs=[desc(b) for b in reg.dst_kv_mem_descs],
            aux_mem_descs=[desc(b) for b in reg.dst_aux_mem_descs],
            state_mem_descs=[[desc(b) for b in c] for c in reg.dst_state_mem_descs],
            kv_args=kv_args,
            attn_tp_size=s.tp_size,
            dcp_size=1,
            dcp_rank=0,
            local_ip="127.0.0.1",
            rank_port=36001,
        )


def make_inputs(
    decode_tp: int = 1, decode_rank: int = 0, prefill_tp: int = 1, prefill_rank: int = 0, kv_heads: int = 0
) -> Inputs:
    """The Qwen3-Next request between the two ranks (``kv_heads``: that many KV heads instead of 2)."""
    rng = np.random.default_rng(2350)
    qwen = profile("qwen3-next")
    if kv_heads:
        qwen = replace(qwen, kv=replace(qwen.kv, heads=kv_heads))
    local = qwen.schema(tp_size=prefill_tp, tp_rank=prefill_rank, pool_pages=4096, max_requests=64)
    peer = qwen.schema(tp_size=decode_tp, tp_rank=decode_rank, pool_pages=4096, max_requests=64)
    return Inputs(local, peer, fragmented_pages(rng, PAGES, 4096), fragmented_pages(rng, PAGES, 4096))


def sglang_plan(ref: ModuleType, inp: Inputs) -> list[Any]:
    """What sglang's MoRI sender computes per request with equal TP (KV plan reused for every layer)."""
    kv_plan = ref.GroupedIndexPlan.from_groups(*ref.group_concurrent_contiguous(inp.src_kv, inp.dst_kv))
    out = [kv_plan.materialize(inp.local.kv.item_len)]
    out += [([3 * n], [5 * n], [n]) for n in inp.local.aux.item_lens]
    lens, ids, peer_ids = inp.state_lists
    for i, _ in ref.build_transfer_entry_pairs(ids, peer_ids, len(lens), len(lens)):
        out.append([(SLOT * lens[i], (SLOT + 1) * lens[i], lens[i])])
    return out


def tp_slice_config(ref: ModuleType, inp: Inputs, kv_heads: int) -> Any:
    """sglang's ``MoriKVManager._build_tp_slice_config`` on these inputs (its lines, with the sender's
    ``kv_args`` and the peer's registration spelled out)."""
    local, peer = inp.local, inp.peer_schema
    page = local.kv.page_size
    src_token, dst_token = local.kv.item_len // page, peer.kv.item_len // page
    per_head = dst_token // max(1, kv_heads // peer.tp_size)
    src_start, heads, dst_start, _ = ref.compute_head_slice_params(
        local.tp_size, peer.tp_size, local.tp_rank, peer.tp_rank, kv_heads
    )
    return ref.TPSliceConfig(
        page,
        local.kv.item_len,
        peer.kv.item_len,
        src_token,
        dst_token,
        src_start * per_head,
        dst_start * per_head,
        heads * per_head,
    )


def sglang_plan_tp(ref: ModuleType, inp: Inputs, cfg: Any) -> list[Any]:
    """What sglang's MoRI sender computes per request with TP differing: one head-slice plan (reused
    for every KV buffer) and each mamba tensor's slice blocks."""
    local, peer = inp.local, inp.peer_schema
    out = [ref._build_tp_slice_transfer_plan(None, inp.src_kv, inp.dst_kv, cfg)]
    comp, pcomp = local.components[0], peer.components[0]
    _, ids, peer_ids = inp.state_lists
    for i, j in ref.build_transfer_entry_pairs(ids, peer_ids, len(comp.tensors), len(pcomp.tensors)):
        t, pt = comp.tensors[i], pcomp.tensors[j]
        out.append(
            ref.compute_mamba_state_slice_byte_blocks(
                src_item_len=t.item_len,
                dst_item_len=pt.item_len,
                src_dim=t.tp_dim,
                dst_dim=pt.tp_dim,
                outer_count=1,
                src_attn_tp_size=local.tp_size,
                dst_attn_tp_size=peer.tp_size,
                dst_tp_rank_in_group=peer.tp_rank,
                local_tp_rank_in_group=local.tp_rank,
                conv_shard_groups=list(t.conv_shard_groups) or None,
            )
        )
    return out


def tp_scenario(
    ref: ModuleType, inp: Inputs, kv_heads: int
) -> tuple[str, tuple[Callable[[], object], Callable[[], object]]]:
    """A TP-mismatched request's scenario, after checking that both sides plan the same KV writes (our
    compact plan's first KV buffer, expanded, against sglang's per-token list)."""
    local, peer_schema = inp.local, inp.peer_schema
    peer, req, cfg = inp.peer, inp.request(), tp_slice_config(ref, inp, kv_heads)
    plan = plan_request(local, peer, req)
    theirs = sglang_plan_tp(ref, inp, cfg)[0]
    kv = plan.select(plan.local_region == 0).expanded()
    ours = sorted(zip(kv.local_offset.tolist(), kv.remote_offset.tolist(), kv.size.tolist(), strict=True))
    if ours != sorted(zip(theirs.local_offsets, theirs.remote_offsets, theirs.sizes, strict=True)):
        raise RuntimeError(f"TP {local.tp_size}->{peer_schema.tp_size}: our KV writes differ from sglang's")
    tps, ranks = f"{local.tp_size}->{peer_schema.tp_size}", f"{local.tp_rank}->{peer_schema.tp_rank}"
    name = f"plan request (TP{tps}, rank {ranks}, {plan.writes / 1000:.0f}K writes in {len(plan):,} rows)"
    return name, (lambda: plan_request(local, peer, req), lambda: sglang_plan_tp(ref, inp, cfg))


def scenarios(ref: ModuleType) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name → (ours, sglang's), each a zero-argument call on prepared inputs."""
    same, req = make_inputs(), make_inputs().request()
    peer = same.peer
    mismatched = dict(
        (
            tp_scenario(ref, make_inputs(decode_tp=2, decode_rank=1), 2),
            tp_scenario(ref, make_inputs(4, 3, 2, 1, kv_heads=8), 8),
            tp_scenario(ref, make_inputs(4, 2, 8, 5, kv_heads=8), 8),
        )
    )
    meta, recv = same.metadata(), same.sglang_receiver(ref)
    reg, recv_meta = (
        same.registration(),
        dict(
            bootstrap_room=ROOM,
            required_dst_info_num=1,
            kv_indices=same.dst_kv,
            aux_index=5,
            state_indices=[[SLOT + 1]],
            decode_prefix_len=None,
            is_dummy=False,
        ),
    )
    item_lens = same.peer_schema.state_item_lens
    conv = same.local.components[0].tensors[0]
    slice_args = dict(
        src_item_len=conv.item_len,
        dst_item_len=conv.item_len // 2,
        src_dim=conv.tp_dim,
        dst_dim=conv.tp_dim // 2,
        outer_count=1,
    )
    groups = list(conv.conv_shard_groups)

    pairing = pairing_for(same.local, peer)

    def ours_request() -> WritePlan:
        """As the agent's prefill side: the peer's pairing is prepared once, at registration."""
        m = codec.decode_metadata(codec.encode_metadata(meta))
        return plan_request(
            same.local,
            peer,
            RequestIndices(
                same.src_kv, m.dst_kv_indices, 3, m.dst_aux_index, req.src_state, list(m.dst_state_indices)
            ),
            pairing=pairing,
        )

    def sglang_request() -> object:
        ref.TransferInfo.from_zmq(ref.build_receiver_metadata_message(recv, **recv_meta)[1:])
        return sglang_plan(ref, same)

    return {
        "request: metadata encode+decode + plan": (ours_request, sglang_request),
        "plan request (equal TP)": (
            lambda: plan_request(same.local, peer, req),
            lambda: sglang_plan(ref, same),
        ),
        **mismatched,
        "pack_int_lists (72 state item lens)": (
            lambda: codec.pack_int_lists(item_lens, "I"),
            lambda: ref.pack_int_lists(item_lens, "I"),
        ),
        "state indices frame ([[slot]])": (
            lambda: codec.pack_int_lists([[SLOT]], "i"),
            lambda: ref._pack_state_indices([np.array([SLOT], np.int32)]),
        ),
        "group_concurrent_contiguous (512 pages)": (
            lambda: contiguous_runs(same.src_kv, same.dst_kv),
            lambda: ref.group_concurrent_contiguous(same.src_kv, same.dst_kv),
        ),
        "mamba slice blocks (conv, TP1->2)": (
            lambda: slice_byte_blocks(
                **slice_args, src_tp=1, dst_tp=2, dst_rank=1, local_rank=0, conv_shard_groups=groups
            ),
            lambda: ref.compute_mamba_state_slice_byte_blocks(
                **slice_args,
                src_attn_tp_size=1,
                dst_attn_tp_size=2,
                dst_tp_rank_in_group=1,
                local_tp_rank_in_group=0,
                conv_shard_groups=groups,
            ),
        ),
        "registration message (encode+decode)": (
            lambda: codec.decode_registration(codec.encode_registration(reg)),
            lambda: ref.KVArgsRegisterInfo.from_zmq(ref.build_receiver_registration_message(recv)[1:]),
        ),
        "metadata message (encode+decode)": (
            lambda: codec.decode_metadata(codec.encode_metadata(meta)),
            lambda: ref.TransferInfo.from_zmq(ref.build_receiver_metadata_message(recv, **recv_meta)[1:]),
        ),
    }


def run(
    iterations: int = 2000,
    cache_dir: Path = sglang_ref.DEFAULT_CACHE,
    *,
    rounds: int = 9,
    cpu: int | None = None,
    pin: bool = True,
    only: str | None = None,
) -> list[Result]:
    """Every scenario (or those whose name contains ``only``), in this process pinned to one CPU
    (``cpu``, or the highest-numbered allowed one; ``pin=False`` leaves the affinity alone); the
    previous affinity is restored afterwards."""
    ref = sglang_ref.load(cache_dir)
    before = os.sched_getaffinity(0) if pin and hasattr(os, "sched_getaffinity") else None
    pinned = pin_to_one_cpu(cpu) if pin else None
    try:
        return [
            rates(ours, theirs, iterations, rounds=rounds).result(name, pinned, planner_kernel.describe())
            for name, (ours, theirs) in scenarios(ref).items()
            if only is None or only in name
        ]
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)


def header(results: list[Result] | None = None) -> str:
    versions = ", ".join(f"{p} {_version(p)}" for p in ("pdpair", "numpy", "msgspec"))
    cpus = {r.cpu for r in results or ()}
    pinned = (
        f"pinned to CPU {cpus.pop()}" if len(cpus) == 1 and None not in cpus else "not pinned to one CPU"
    )
    rounds = max((len(r.ratios) for r in results or ()), default=0)
    return (
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()})\n"
        f"python {sys.version.split()[0]}, {versions}; "
        f"reference: sglang {sglang_ref.SGLANG_VERSION} helpers\n"
        f"planner common shape: {planner_kernel.describe()}\n"
        f"{pinned}; {rounds} alternating rounds, garbage collector off while timing; "
        "rates: best round; ratio spread: min / median / max of the rounds' ratios"
    )


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def render(results: list[Result], as_json: bool) -> str:
    if as_json:
        return json.dumps([r.as_dict() for r in results], indent=2)
    width = max(len(r.scenario) for r in results)
    lines = [
        header(results),
        "",
        f"{'scenario':<{width}}  {'ours/s':>12}  {'sglang/s':>12}  {'ratio':>7}  {'ratio spread':>20}",
    ]
    for r in results:
        spread = (
            f"{min(r.ratios):.1f} / {statistics.median(r.ratios):.1f} / {max(r.ratios):.1f}"
            if r.ratios
            else ""
        )
        lines.append(
            f"{r.scenario:<{width}}  {r.ours_per_s:>12,.0f}  {r.sglang_per_s:>12,.0f}  {r.ratio:>6.1f}x"
            f"  {spread:>20}"
        )
    return "\n".join(lines)
