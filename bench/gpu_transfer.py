"""GPU state transfer benchmark: prefill → decode between two processes on one GPU, through NIXL VRAM.

Run on a CUDA machine (one command; prints a table last):

    PYTHONUNBUFFERED=1 python3 bench/gpu_transfer.py [--json out.json] [--slot-mib 64,256] [--cases ...]
        [--paths all|ipc]

For each case (block sizes 4 KiB..64 MiB, scattered; a Qwen3-Next-like and a DeepSeek-V3.2-like
request at full size; Qwen3-Next rooms of 32K tokens from a prefill rank to a decode rank of equal
and of different TP sizes, ``gpu_cases.ROOMS``) it measures, side by side in one run:

- ``d2d``: a torch device-to-device copy of the same number of bytes (the device's limit; GB/s
  counts bytes moved once);
- ``raw``: raw NIXL, one descriptor per planned write, one prepared handle re-posted;
- ``direct``: the agent's path, ``NixlTransport.write`` of the plan, one write per component;
- ``staged``: every write staged (``dataplane.staging``: gather kernel into a registered slot, one
  write, notice, scatter kernel on decode, ack), per slot size given;
- ``auto``: the per-component policy (``choose_paths``, threshold ``--threshold-kib``);
- ``ipc``: the ``cuda-ipc`` transport (``transports.cuda_ipc``): decode's regions mapped into prefill
  through CUDA IPC, the whole plan one launch of the copy kernel, page to page; done at its CUDA event;
  ``ipc xN`` (with ``--inflight N``): N such writes back to back, GB/s over all N (rooms in flight).

``--paths ipc`` measures ``d2d`` and ``ipc`` alone and needs no NIXL. A TP-mismatched room goes to
the transports as the agent hands it over: compact (strided rows) to ``ipc`` and ``direct``, expanded
to one row per write for ``raw`` and the staged paths; its ``ipc`` GB/s is also given as a share of
its equal-TP room's.

Times are medians; staged/auto end when decode's last scatter is acknowledged, direct/raw when the
initiator sees the write complete. Every path's bytes are verified byte for byte per component:
decode's arena is poisoned before the path's first run (prefill's bytes never equal the poison), and
after its last, decode compares the bytes each component's writes cover, in plan order, with
prefill's (written to a scratch file once per case) and counts its arena's changed bytes, which must
be exactly the plan's (nothing written outside it).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import multiprocessing as mp
import pstats
import select
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_cases import CASES, QUICK, Case, Layout, MiB, build_layout, gathered, plan_for
from bench.gpu_env import environment
from dataplane.agent.staged import StagedLanding, StagedWriter
from dataplane.planner import WritePlan
from dataplane.staging import (
    SlotPool,
    StagedNotice,
    StagedSender,
    choose_paths,
    decode_staged,
    encode_staged,
    expand,
    pieces_of,
    region_rows,
)
from dataplane.staging.gpu import TorchStager
from dataplane.transports import NixlTransport, Transfer, TransferState, Transport, Writes
from dataplane.transports.cuda_ipc import CudaIpcTransport
from dataplane.transports.nixl import load_sdk

STAGING_BYTES = 1 << 30
DEADLINE_S = 60.0
POISON = 0x5A
_enc = msgspec.msgpack.Encoder()


def send(conn: Any, **msg: Any) -> None:
    conn.send_bytes(_enc.encode(msg))


def recv(conn: Any) -> dict[str, Any]:
    if not conn.poll(120):
        raise TimeoutError("peer process did not answer within 120 s")
    return msgspec.msgpack.decode(conn.recv_bytes())


def arrays(plan: WritePlan, side: str) -> dict[str, bytes]:
    return {
        "region": getattr(plan, f"{side}_region").tobytes(),
        "offset": getattr(plan, f"{side}_offset").tobytes(),
        "size": plan.size.tobytes(),
        "component": plan.component.tobytes(),
    }


def as_writes(plan: WritePlan) -> Writes:
    return Writes(
        plan.local_region, plan.local_offset, plan.remote_region, plan.remote_offset, plan.size, plan.repeat
    )


def unarrays(msg: dict[str, Any]) -> tuple[np.ndarray, ...]:
    return tuple(np.frombuffer(msg[k], dtype=t) for k, t in
                 (("region", np.int32), ("offset", np.int64), ("size", np.int64), ("component", np.int16)))


# ---- decode process -------------------------------------------------------------------------
class Decode:
    """The decode side: owns its layout, transport, raw agent and staged receiver; serves commands."""

    def __init__(self, cmd: Any, stg: Any):
        self.cmd, self.stg = cmd, stg
        self.layout: Layout | None = None
        self.transport: NixlTransport | None = None
        self.ipc: CudaIpcTransport | None = None
        self.raw: Any = None
        self.receiver: StagedLanding | None = None
        self.expect: dict[str, Any] = {}
        self.stg_poll, self.cmd_poll = select.poll(), select.poll()
        self.stg_poll.register(stg.fileno(), select.POLLIN)
        self.cmd_poll.register(cmd.fileno(), select.POLLIN)

    def serve(self) -> None:
        while True:
            if self.receiver is not None:
                while self.stg_poll.poll(0):
                    self.receiver.on_message(self.stg.recv_bytes())
                self.receiver.step()
            if self.cmd_poll.poll(0 if self.receiver is not None else 10):
                msg = msgspec.msgpack.decode(self.cmd.recv_bytes())
                if msg["op"] == "exit":
                    return
                send(self.cmd, **getattr(self, "op_" + msg["op"])(msg))

    def op_setup(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        self.layout = layout = build_layout(Case(**msg["case"]), STAGING_BYTES, "decode")
        out: dict[str, Any] = {"arena": layout.arena.data_ptr()}
        if msg["nixl"]:
            self.transport = NixlTransport(f"decode-{msg['i']}")
            out["blobs"] = self.transport.register(layout.regions)
            out["endpoint"] = self.transport.endpoint()
            sdk = load_sdk()
            self.raw = sdk.nixl_agent(f"rawd-{msg['i']}", sdk.nixl_agent_config(enable_listen_thread=False))
            self.raw.register_memory([(layout.arena.data_ptr(), layout.arena.numel(), 0, "")], "VRAM")
            out["raw"] = bytes(self.raw.get_agent_metadata())
        self.ipc = CudaIpcTransport(0)
        out["ipc_blobs"] = self.ipc.register(layout.regions)
        out["ipc_endpoint"] = self.ipc.endpoint()
        torch.cuda.synchronize()
        return out

    def op_slots(self, msg: dict[str, Any]) -> dict[str, Any]:
        layout = self.layout
        assert layout is not None
        pool = SlotPool(STAGING_BYTES // msg["slot_bytes"], msg["slot_bytes"], layout.staging)
        stager = TorchStager(layout.arena, layout.staging, kernel=msg["kernel"])
        send = self.stg.send_bytes
        self.receiver = StagedLanding(stager, pool, bases=layout.bases, sizes=layout.sizes, send=send)
        return {}

    def op_profile(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg["on"]:
            self.profiler = cProfile.Profile()
            self.profiler.enable()
            return {}
        self.profiler.disable()
        return {"text": profile_text(self.profiler)}

    def op_poison(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        assert self.layout is not None
        self.layout.arena.fill_(POISON)
        torch.cuda.synchronize()
        return {}

    def op_expect(self, msg: dict[str, Any]) -> dict[str, Any]:
        """What the case's paths must leave here: the plan's writes one per row (decode's side) and
        prefill's bytes of each component, in plan order, at ``[start, start + length)`` of a file."""
        self.expect = {"arrays": unarrays(msg), "path": msg["path"], "spans": msg["spans"]}
        return {}

    def op_verify(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Each component's bytes compared with prefill's, and the arena's bytes that are no longer the
        poison (the plan's bytes exactly when nothing outside the plan was written)."""
        assert self.layout is not None
        got = gathered(self.layout, *self.expect["arrays"])
        ok = {}
        for comp, (start, length) in self.expect["spans"].items():
            want = np.memmap(self.expect["path"], dtype=np.uint8, mode="r", offset=start, shape=(length,))
            mine = got.get(int(comp))
            same = mine is not None and mine.numel() == length
            ok[comp] = same and np.array_equal(mine.cpu().numpy(), want)
        changed = int((self.layout.arena != POISON).sum().item())
        return {"ok": ok, "changed": changed}

    def op_teardown(self, msg: dict[str, Any]) -> dict[str, Any]:
        import torch

        if self.transport is not None:
            self.transport.close()
        if self.ipc is not None:
            self.ipc.close()
        self.layout = self.transport = self.raw = self.receiver = self.ipc = None
        torch.cuda.empty_cache()
        return {}


def profile_text(prof: cProfile.Profile) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
    return out.getvalue()


def decode_main(cmd: Any, stg: Any) -> None:
    import torch

    torch.cuda.set_device(0)
    Decode(cmd, stg).serve()


# ---- prefill process (this one) -------------------------------------------------------------
def timed(fn: Callable[[], None], min_s: float, max_reps: int) -> list[float]:
    fn()
    times: list[float] = []
    while len(times) < 3 or (sum(times) < min_s and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def spin(transport: Transport, transfers: list[Transfer], deadline: float) -> None:
    for t in transfers:
        while (state := transport.poll(t)) is TransferState.IN_PROGRESS:
            if time.monotonic() > deadline:
                transport.abort(t)
                raise TimeoutError("transfer past its deadline")
        if state is TransferState.FAILED:
            assert t.error is not None
            raise t.error


class Prefill:
    def __init__(self, args: argparse.Namespace, cmd: Any, stg: Any, scratch: str):
        self.args, self.cmd, self.stg, self.scratch = args, cmd, stg, scratch
        self.room = 0

    def profile(self, once: Callable[[], None]) -> None:
        """Host time of the staged path on both sides (cProfile over 20 requests)."""
        once()
        self.call("profile", on=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            once()
        prof.disable()
        print("== prefill profile (20 staged requests)\n" + profile_text(prof))
        print("== decode profile\n" + self.call("profile", on=False)["text"], flush=True)

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        send(self.cmd, op=op, **kw)
        return recv(self.cmd)

    def run_case(self, i: int, case: Case) -> dict[str, Any]:
        import torch

        layout = build_layout(case, STAGING_BYTES, "prefill")
        layout.arena.random_()
        layout.arena.masked_fill_(layout.arena == POISON, POISON + 1)  # no source byte is the poison
        plan = plan_for(case)
        flat = plan.expanded()
        self.expect(i, layout, flat)
        nixl = self.args.paths == "all"
        reply = self.call("setup", i=i, case=dataclasses.asdict(case), nixl=nixl)
        transport = peer = raw = raw_peer = None
        if nixl:
            transport = NixlTransport(f"prefill-{i}")
            transport.register(layout.regions)
            peer = transport.connect("decode", reply["endpoint"], reply["blobs"])
            sdk = load_sdk()
            raw = sdk.nixl_agent(f"rawp-{i}", sdk.nixl_agent_config(enable_listen_thread=False))
            raw.register_memory([(layout.arena.data_ptr(), layout.arena.numel(), 0, "")], "VRAM")
            raw_peer = raw.add_remote_agent(reply["raw"])
        torch.cuda.synchronize()
        ctx = Ctx(self, case, layout, plan, transport, peer, raw, raw_peer, reply["arena"])
        ctx.ipc = CudaIpcTransport(0)
        ctx.ipc.register(layout.regions)
        ctx.ipc_peer = ctx.ipc.connect("decode", reply["ipc_endpoint"], reply["ipc_blobs"])
        row: dict[str, Any] = {"case": case.name, "bytes": plan.total_bytes, "writes": plan.writes,
                               "rows": len(plan), "equal": case.equal,
                               "components": {str(k): v for k, v in plan.bytes_by_component().items()}}
        row["d2d"] = ctx.d2d()
        row["ipc"] = ctx.measure("ipc", ctx.ipc_once)
        row["ipc"]["post_us"] = statistics.median(ctx.ipc_post_us)
        if self.args.inflight > 1:
            n = self.args.inflight
            row[f"ipc x{n}"] = ctx.measure(f"ipc x{n}", ctx.ipc_pipelined(n), requests=n)
        if nixl:
            self.nixl_paths(ctx, row)
        if case.name in (self.args.profile or ()):
            self.profile(ctx.staged(self.args.slot_mib[-1] * MiB, None, self.args.kernels[-1]))
        ctx.ipc.close()
        if transport is not None:
            transport.close()
        self.call("teardown")
        del ctx, layout
        torch.cuda.empty_cache()
        return row

    def expect(self, i: int, layout: Layout, flat: WritePlan) -> None:
        """Prefill's bytes of every component of the plan, in plan order, to a scratch file decode
        compares its own with after each path (``op_verify``)."""
        path = Path(self.scratch) / f"case-{i}.bin"
        spans: dict[str, tuple[int, int]] = {}
        with path.open("wb") as f:
            for comp, data in gathered(layout, flat.local_region, flat.local_offset, flat.size,
                                       flat.component).items():
                spans[str(comp)] = (f.tell(), data.numel())
                data.cpu().numpy().tofile(f)
        self.call("expect", path=str(path), spans=spans, **arrays(flat, "remote"))

    def nixl_paths(self, ctx: Ctx, row: dict[str, Any]) -> None:
        row["gather"] = ctx.gather_kernel(self.args.kernels[0])
        row["host_us"] = ctx.host_staging(self.args.slot_mib[0] * MiB)
        row["raw"] = ctx.measure("raw", ctx.raw_once)
        row["direct"] = ctx.measure("direct", ctx.direct_once)
        for kernel in self.args.kernels:
            for mib in self.args.slot_mib:
                once = ctx.staged(mib * MiB, None, kernel)
                name = f"staged-{kernel}@{mib}"
                row[name] = ctx.measure(name, once) | {"stages": ctx.stages()}
        auto = choose_paths(ctx.flat, self.args.threshold_kib << 10)
        row["policy"] = {str(k): v for k, v in auto.paths.items()}
        threshold = self.args.threshold_kib << 10
        auto_once = ctx.staged(self.args.slot_mib[0] * MiB, threshold, self.args.kernels[0])
        row["auto"] = ctx.measure("auto", auto_once)
        if self.args.inflight > 1:
            n, kernel, mib = self.args.inflight, self.args.kernels[0], self.args.slot_mib[0]
            once = ctx.staged(mib * MiB, None, kernel, inflight=n)
            row[f"staged-{kernel}@{mib}x{n}"] = ctx.measure(f"staged x{n}", once, requests=n)


class Ctx:
    """One case's live state on the prefill side and its measured paths."""

    def __init__(self, pf: Prefill, case: Case, layout: Layout, plan: WritePlan, transport: Any, peer: Any,
                 raw: Any, raw_peer: Any, remote_arena: int):
        """``plan`` goes compact to the engines that take strided rows (``ipc``, ``direct``);
        ``flat`` (one row per write) to the raw engine and the staged paths."""
        self.pf, self.case, self.layout, self.plan, self.flat = pf, case, layout, plan, plan.expanded()
        self.transport, self.peer, self.raw, self.raw_peer = transport, peer, raw, raw_peer
        self.remote_arena = remote_arena
        self.parts = [as_writes(plan.select(plan.component == c)) for c in np.unique(plan.component).tolist()]
        self.sender: StagedSender | None = None
        self.ipc: Any = None
        self.ipc_peer: Any = None
        self.whole = as_writes(plan)
        self.ipc_post_us: list[float] = []

    def measure(self, name: str, once: Callable[[], None], requests: int = 1) -> dict[str, Any]:
        self.pf.call("poison")
        try:
            times = timed(once, self.pf.args.min_seconds, self.pf.args.max_reps)
        except Exception as exc:  # a failing path is a result too: record it and go on
            print(f"  {self.case.name} {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            return {"error": f"{type(exc).__name__}: {exc}"}
        check = self.pf.call("verify")
        ok = check["ok"]
        med = statistics.median(times)
        gbps = requests * self.plan.total_bytes / med / 1e9
        verified = bool(ok) and all(ok.values()) and check["changed"] == self.plan.total_bytes
        out = {"gbps": gbps, "median_us": med * 1e6, "reps": len(times), "verified": verified,
               "per_component_ok": ok, "changed_bytes": check["changed"]}
        print(f"  {self.case.name:22s} {name:10s} {out['gbps']:9.1f} GB/s  {med * 1e6:10.1f} us  "
              f"reps={len(times)} verified={out['verified']}", flush=True)
        return out

    def d2d(self) -> dict[str, Any]:
        import torch

        n = self.plan.total_bytes
        src = self.layout.arena[:n]
        dst = torch.empty(n, dtype=torch.uint8, device="cuda")
        return self._events(lambda: dst.copy_(src), n, "d2d")

    def gather_kernel(self, kernel: str) -> dict[str, Any]:
        """The staged gather alone: one kernel per component, into a scratch buffer of the request's size."""
        import torch

        p, lay = self.flat, self.layout
        pieces = pieces_of(0, p, lay.bases, lay.sizes, p.total_bytes)
        scratch = torch.empty(p.total_bytes + (1 << 20) * len(pieces), dtype=torch.uint8, device="cuda")
        stager = TorchStager(lay.arena, scratch, kernel=kernel)  # type: ignore[arg-type]
        offsets = np.cumsum([0] + [(len(x.src_rows) * x.chunk + (1 << 20) - 1) >> 20 << 20 for x in pieces])

        def gather_all() -> None:
            for piece, off in zip(pieces, offsets, strict=False):
                event = stager.gather(piece.src_rows, int(off), piece.chunk)
            event.synchronize()

        out = self._events(gather_all, p.total_bytes, "gather")
        out["chunks"] = sorted({x.chunk for x in pieces})
        return out

    def host_staging(self, slot_bytes: int) -> dict[str, float]:
        """Host time per request of the staged path's bookkeeping, both sides, no device work:
        prefill's ``pieces_of`` + notices, decode's decode + checks + expansion to arena rows."""
        lay = self.layout
        times: dict[str, list[float]] = {"prefill": [], "decode": []}
        for _ in range(20):
            t0 = time.perf_counter()
            pieces = pieces_of(0, self.flat, lay.bases, lay.sizes, slot_bytes)
            wire = [encode_staged(StagedNotice.of(0, p.seq, p.pieces, 0, p.chunk, p.dst)) for p in pieces]
            t1 = time.perf_counter()
            for data in wire:
                notice = decode_staged(data)
                assert isinstance(notice, StagedNotice)
                expand(notice.runs(), *region_rows(lay.bases, lay.sizes, notice.chunk))
            t2 = time.perf_counter()
            times["prefill"].append((t1 - t0) * 1e6)
            times["decode"].append((t2 - t1) * 1e6)
        out = {k: statistics.median(v) for k, v in times.items()}
        print(f"  {self.case.name:22s} host(us)   prefill={out['prefill']:.0f} decode={out['decode']:.0f}",
              flush=True)
        return out

    def stages(self) -> dict[str, float]:
        """Median microseconds of each stage over the pieces of the staged path's last run."""
        pieces = list(self.sender.finished) if self.sender else []
        steps = (("gather", "start", "gathered"), ("post", "gathered", "posted"),
                 ("write", "posted", "written"), ("notice_scatter_ack", "written", "acked"),
                 ("total", "start", "acked"))
        last = [x for x in pieces if x.room == self.pf.room]
        out = {name: statistics.median((x.marks[b] - x.marks[a]) * 1e6 for x in last) for name, a, b in steps}
        out["pieces"] = len(last)
        print(f"  {'':22s} stages(us) " + " ".join(f"{k}={v:.0f}" for k, v in out.items()), flush=True)
        return out

    def _events(self, fn: Callable[[], Any], nbytes: int, name: str) -> dict[str, Any]:
        from bench.gpu_kernels import timed  # imports torch: only where the GPU cases run

        med = timed(fn)
        print(f"  {self.case.name:22s} {name:10s} {nbytes / med / 1e9:9.1f} GB/s  {med * 1e6:10.1f} us",
              flush=True)
        return {"gbps": nbytes / med / 1e9, "median_us": med * 1e6}

    # -- paths --
    def raw_once(self) -> None:
        if not hasattr(self, "_raw_handle"):
            p, base = self.flat, self.layout.arena.data_ptr()
            zero, bases = np.zeros(len(p), np.int64), self.layout.bases
            lrows = np.stack([base + bases[p.local_region] + p.local_offset, p.size, zero], axis=1)
            remote_at = self.remote_arena + bases[p.remote_region] + p.remote_offset
            rrows = np.stack([remote_at, p.size, zero], axis=1)
            lrows, rrows = lrows.astype(np.uint64), rrows.astype(np.uint64)
            local, remote = self.raw.get_xfer_descs(lrows, "VRAM"), self.raw.get_xfer_descs(rrows, "VRAM")
            self._raw_handle = self.raw.initialize_xfer("WRITE", local, remote, self.raw_peer)
        handle, deadline = self._raw_handle, time.monotonic() + DEADLINE_S
        if self.raw.transfer(handle) == "ERR":
            raise RuntimeError("raw NIXL transfer failed to post")
        while (state := self.raw.check_xfer_state(handle)) == "PROC":
            if time.monotonic() > deadline:
                raise TimeoutError("raw transfer past its deadline")
        if state != "DONE":
            raise RuntimeError(f"raw NIXL transfer ended {state}")

    def ipc_once(self) -> None:
        """The ``cuda-ipc`` transport: the whole plan as one write (one kernel), as the agent sends a
        room over it; done when its event is. ``ipc_post_us`` keeps how long ``write`` took to return
        (host planning and the launch)."""
        t0 = time.perf_counter()
        transfer = self.ipc.write(self.ipc_peer, self.whole)
        self.ipc_post_us.append((time.perf_counter() - t0) * 1e6)
        spin(self.ipc, [transfer], time.monotonic() + DEADLINE_S)

    def ipc_pipelined(self, n: int) -> Callable[[], None]:
        """``n`` whole-plan writes back to back, then wait for all: rooms in flight, where one room's
        host time overlaps the previous room's copy (same bytes to the same pages, in stream order)."""

        def once() -> None:
            transfers = [self.ipc.write(self.ipc_peer, self.whole) for _ in range(n)]
            spin(self.ipc, transfers, time.monotonic() + DEADLINE_S)

        return once

    def direct_once(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        spin(self.transport, [self.transport.write(self.peer, part) for part in self.parts], deadline)

    def staged(
        self, slot_bytes: int, threshold: int | None, kernel: str, inflight: int = 1
    ) -> Callable[[], None]:
        """Through the agent's glue (``StagedWriter``): the policy's direct part per component, the
        staged part gathered, written per slot, noticed, scattered by decode and acknowledged.
        ``inflight`` requests (the same plan, new rooms) are submitted back to back and overlap."""
        lay, transport, peer = self.layout, self.transport, self.peer
        self.pf.call("slots", slot_bytes=slot_bytes, kernel=kernel)
        writer = StagedWriter(
            transport, peer, TorchStager(lay.arena, lay.staging, kernel=kernel),  # type: ignore[arg-type]
            SlotPool(STAGING_BYTES // slot_bytes, slot_bytes, lay.staging), staging_region=lay.staging_id,
            landing_region=lay.staging_id, bases=lay.bases, sizes=lay.sizes, send=self.pf.stg.send_bytes,
            threshold=threshold or 0,
        )
        self.sender = writer.sender
        poller = select.poll()
        poller.register(self.pf.stg.fileno(), select.POLLIN)

        def progress(deadline: float) -> None:
            writer.step()
            while poller.poll(0):
                writer.on_message(self.pf.stg.recv_bytes())
            if time.monotonic() > deadline:
                raise TimeoutError("staged transfer past its deadline")

        def once() -> None:
            deadline = time.monotonic() + DEADLINE_S
            rooms, transfers = [], []
            for _ in range(inflight):
                self.pf.room += 1
                rooms.append(self.pf.room)
                direct = writer.route(self.pf.room, self.flat, force="staged" if threshold is None else None)
                comps = np.unique(direct.component).tolist()
                parts = [as_writes(direct.select(direct.component == c)) for c in comps]
                transfers += [transport.write(peer, part) for part in parts]
                progress(deadline)
            while not all(writer.done(room) for room in rooms):
                progress(deadline)
            spin(transport, transfers, deadline)

        return once


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """GB/s of each path (bytes moved once) and, in brackets, its % of the D2D copy of the same bytes;
    then each TP-mismatched room's ``ipc`` GB/s as a share of its equal-TP room's."""
    ipc = [f"ipc x{args.inflight}"] if args.inflight > 1 else []
    cols = ["ipc", *ipc]
    if args.paths == "all":
        staged = [f"staged-{k}@{m}" for k in args.kernels for m in args.slot_mib]
        piped = [f"staged-{args.kernels[0]}@{args.slot_mib[0]}x{args.inflight}"] if args.inflight > 1 else []
        cols = ["raw", "direct", *staged, *piped, "auto", *cols]
    head = (f"{'case':21s} {'MiB':>6s} {'writes':>7s} {'rows':>6s} {'d2d':>7s} {'gather':>7s} "
            f"{'host_us':>7s} " + " ".join(f"{c:>17s}" for c in cols) + "  verified")
    lines = [head, "-" * len(head)]
    for r in rows:
        d2d = r["d2d"]["gbps"]
        cells = []
        for c in cols:
            v = r.get(c, {})
            ok_cell = "gbps" in v
            cells.append(f"{v['gbps']:8.1f} ({100 * v['gbps'] / d2d:4.1f}%)" if ok_cell else "FAILED")
        ok = all(r.get(c, {}).get("verified", False) for c in cols)
        host = f"{sum(r['host_us'].values()):7.0f}" if "host_us" in r else f"{'-':>7s}"
        gather = f"{r['gather']['gbps']:7.0f}" if "gather" in r else f"{'-':>7s}"
        mib = r["bytes"] / MiB
        lead = f"{r['case']:21s} {mib:6.0f} {r['writes']:7d} {r['rows']:6d} {d2d:7.0f} {gather} {host} "
        lines.append(lead + " ".join(f"{c:>17s}" for c in cells) + f"  {'yes' if ok else 'NO'}")
    shares = tp_shares(rows, cols)
    if shares:
        title = f"{'TP-mismatched room':21s} {'of equal-TP room':21s} "
        lines += ["", title + " ".join(f"{c:>9s}" for c in cols)]
        for room, equal, values in shares:
            cells = [f"{100 * v:8.1f}%" if v is not None else f"{'-':>9s}" for v in values]
            lines.append(f"{room:21s} {equal:21s} " + " ".join(cells))
    return "\n".join(lines)


def tp_shares(rows: list[dict[str, Any]], cols: list[str]) -> list[tuple[str, str, list[float | None]]]:
    """Per TP-mismatched room measured beside its equal-TP room: each path's GB/s over the equal room's."""
    by_name = {r["case"]: r for r in rows}
    out = []
    for r in rows:
        equal = by_name.get(r.get("equal") or "")
        if equal is None:
            continue
        values: list[float | None] = []
        for c in cols:
            mine, theirs = r.get(c, {}).get("gbps"), equal.get(c, {}).get("gbps")
            values.append(mine / theirs if mine and theirs else None)
        out.append((r["case"], equal["case"], values))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="also write every number (and the environment) here")
    ap.add_argument("--cases", nargs="*", help="case names (default: all)", default=None)
    ap.add_argument("--paths", choices=("all", "ipc"), default="all",
                    help="every path, or d2d and cuda-ipc alone (no NIXL needed)")
    ap.add_argument("--slot-mib", default="64", help="staging slot sizes to try, comma-separated (MiB)")
    ap.add_argument("--threshold-kib", type=int, default=512, help="auto policy: stage components whose "
                    "mean write is under this many KiB")
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--max-reps", type=int, default=30)
    ap.add_argument("--kernels", default="triton,torch", help="staging kernels to try (first: auto, gather)")
    ap.add_argument("--profile", nargs="*", help="cases whose staged path to profile (host time)")
    ap.add_argument("--inflight", type=int, default=4, help="requests in flight for the pipelined staged "
                    "(first kernel and slot size) and ipc columns; 1 leaves them out")
    ap.add_argument("--quick", action="store_true", help="small cases (the integration test's)")
    args = ap.parse_args()
    args.slot_mib = [int(x) for x in args.slot_mib.split(",")]
    args.kernels = args.kernels.split(",")
    known = QUICK if args.quick else CASES
    cases = [c for c in known if args.cases is None or c.name in args.cases]
    unknown = sorted(set(args.cases or ()) - {c.name for c in known})
    if unknown:
        ap.error(f"--cases: unknown {unknown}; known: {', '.join(c.name for c in known)}")
    if args.profile and args.paths != "all":
        ap.error("--profile profiles the staged path: give it with --paths all")
    env = environment()
    print(json.dumps(env, indent=1), flush=True)
    ctx = mp.get_context("spawn")
    cmd_a, cmd_b = ctx.Pipe()
    stg_a, stg_b = ctx.Pipe()
    child = ctx.Process(target=decode_main, args=(cmd_b, stg_b), daemon=True)
    child.start()
    import torch

    torch.cuda.set_device(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pdpair-gpu-") as scratch:
        pf = Prefill(args, cmd_a, stg_a, scratch)
        try:
            for i, case in enumerate(cases):
                print(f"case {case.name}", flush=True)
                rows.append(pf.run_case(i, case))
        finally:
            send(cmd_a, op="exit")
            child.join(30)
    env["environment_after"] = environment(nixl_loaded=args.paths == "all")
    if args.json:
        doc = {"env": env, "args": vars(args) | {"json": str(args.json)}, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    print(table(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
