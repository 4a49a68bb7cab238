"""One sglang scheduler rank's disaggregation side, driven as sglang 0.5.23 drives it, minus the model.

sglang's model runner and memory pools need a GPU, so a rank here holds pools of the same shapes and
buffer lists as sglang's (``Family`` below: MHA / MLA per-layer KV buffers, Mamba conv + temporal
slots, DSA index-key pages, SWA pages) and fills ``KVArgs`` field by field as
``disaggregation/prefill.py::PrefillBootstrapQueue._init_kv_manager`` and
``decode.py::DecodePreallocQueue._init_kv_manager`` do, with sglang's own ``append_state_component``
(``disaggregation/utils.py``) for the state components and sglang's own ``MetadataBuffers`` for aux.
Everything after that is sglang's code path: the classes come from sglang's ``get_kv_class``, and the
calls follow (file::function):

- prefill: ``prefill.py::PrefillBootstrapQueue.create_sender`` (sender per request),
  ``pop_bootstrapped`` (poll until WaitingForInput), ``finalize_bootstrap`` (``pop_decode_prefix_len``,
  ``init(num_pages, metadata_buffer_index)``), ``SchedulerDisaggregationPrefillMixin.send_kv_chunk``
  (``should_send_kv_chunk`` + ``send(page_indices, state_indices on the last chunk)``),
  ``process_disagg_prefill_inflight_queue`` (poll until Success / Failed, ``failure_exception``);
- decode: ``decode.py::DecodePreallocQueue._create_receiver_and_enqueue`` (receiver per request),
  ``_ensure_prefill_info`` (``try_ensure_parallel_info``), ``_init_receiver`` (``init``),
  ``_send_kv_metadata`` (``send_metadata(pages, aux, state, decode_prefix_len)``),
  ``DecodeTransferQueue.pop_transferred`` (poll until Success / Failed).

Prefill fills its source items with random bytes; decode checks every destination byte per component
and that nothing outside its destinations was written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

torch: Any = None


def _torch() -> Any:
    global torch
    if torch is None:
        import torch as t

        torch = t
    return torch


@dataclass
class Tensor:
    """One registered buffer: ``num_items`` items of ``item_len`` bytes (a flat uint8 view)."""

    data: Any  # torch uint8 tensor [num_items, item_len]

    @property
    def num_items(self) -> int:
        return int(self.data.shape[0])

    @property
    def item_len(self) -> int:
        return int(self.data.shape[1])


@dataclass
class StateComp:
    state_type: str
    tensors: list[Tensor]
    dims: list[int] = field(default_factory=list)
    layer_ids: list[int] = field(default_factory=list)
    conv_groups: list[list[int] | None] = field(default_factory=list)
    outer_counts: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Family:
    """A model family's pool geometry at test scale (item sizes in bytes)."""

    name: str
    layers: int
    page_size: int = 16
    kv_pages: int = 64
    kv_layers: tuple[int, ...] = ()
    mla: bool = False
    kv_item: int = 2048
    mamba_slots: int = 0
    swa_pages: int = 0
    dsa_item: int = 0


QWEN3_NEXT = Family("qwen3-next", layers=8, kv_layers=(3, 7), mamba_slots=8)
DEEPSEEK_V32 = Family("deepseek-v3.2", layers=4, kv_layers=(0, 1, 2, 3), mla=True, kv_item=16 * 576 * 2,
                      dsa_item=16 * 132)
GPT_OSS = Family("gpt-oss", layers=4, kv_layers=(1, 3), swa_pages=32)
FAMILIES = {f.name: f for f in (QWEN3_NEXT, DEEPSEEK_V32, GPT_OSS)}


class Memory:
    """Where a rank's pools live: PDPair host arenas (CPU) or CUDA (the GPU run)."""

    def __init__(self, device: str):
        self.device = device
        self.arenas: list[Any] = []

    def zeros(self, items: int, item_len: int) -> Tensor:
        t = _torch()
        if self.device == "cuda":
            return Tensor(t.zeros((items, item_len), dtype=t.uint8, device="cuda"))
        from dataplane.sglang.memory import HostArena

        arena = HostArena(items * item_len, huge_pages="never")
        self.arenas.append(arena)
        return Tensor(arena.tensor((items, item_len), t.uint8))

    def close(self) -> None:
        for a in self.arenas:
            a.close()


class Rank:
    """One scheduler rank of one role: its pools, ``KVArgs``, the pdpair manager and its rooms."""

    def __init__(self, role: str, family: Family, *, tp_size: int = 1, tp_rank: int = 0, dp_size: int = 1,
                 device: str = "cpu", aux_slots: int = 8, server_overrides: dict[str, Any] | None = None,
                 bootstrap_addr: str = "127.0.0.1:8998"):
        """``bootstrap_addr``: the prefill's bootstrap ``host:port`` its requests carry (the router's)."""
        from sglang.srt.disaggregation.utils import (
            DisaggregationMode,
            KVClassType,
            MetadataBuffers,
            TransferBackend,
            get_kv_class,
        )

        t = _torch()
        self.role, self.family, self.mem = role, family, Memory(device)
        self.bootstrap_addr = bootstrap_addr
        self.backend = TransferBackend("pdpair")
        self.get_kv_class, self.KVClassType = get_kv_class, KVClassType
        attn_tp = tp_size // dp_size
        kv_item = family.kv_item if family.mla else family.kv_item // attn_tp  # MHA heads split by TP
        self.kv = [self.mem.zeros(family.kv_pages, kv_item)
                   for _ in range(len(family.kv_layers) * (1 if family.mla else 2))]
        self.states = self._states(attn_tp)
        # sglang's own MetadataBuffers (the plugin's hook moves its tensors where the agent reaches them).
        self.metadata = MetadataBuffers(aux_slots, hidden_size=64, hidden_states_dtype=t.bfloat16,
                                        max_sampling_mask_tokens=16, max_top_logprobs_num=8)
        self.free_aux = list(range(aux_slots))
        self.free: dict[str, list[int]] = {}
        self.kv_args = self._kv_args(get_kv_class(self.backend, KVClassType.KVARGS)(), tp_rank)
        manager_class = get_kv_class(self.backend, KVClassType.MANAGER)
        mode = DisaggregationMode.PREFILL if role == "prefill" else DisaggregationMode.DECODE
        args = {"tp_size": tp_size, "attn_dp_size": dp_size} | (server_overrides or {})
        self.server_args = server_args(role=role, **args)
        self.manager = manager_class(self.kv_args, mode, self.server_args, family.mla)

    # ---- pools, as sglang's memory pools lay them out ------------------------------------------
    def _states(self, attn_tp: int) -> list[StateComp]:
        f, out = self.family, []
        if f.mamba_slots:
            linear = [i for i in range(f.layers) if i not in f.kv_layers]
            conv_dim, kernel, heads, kd, vd = 3 * 128 // attn_tp, 3, 4 // attn_tp, 32, 32
            conv = [self.mem.zeros(f.mamba_slots + 1, conv_dim * kernel * 2) for _ in linear]
            temporal = [self.mem.zeros(f.mamba_slots + 1, heads * kd * vd * 4) for _ in linear]
            groups = [[128, 128, 128]] * len(linear) + [None] * len(linear)
            dims = [conv_dim] * len(linear) + [heads] * len(linear)
            out.append(StateComp("mamba", conv + temporal, dims=dims, layer_ids=linear * 2,
                                 conv_groups=groups, outer_counts=[1] * (2 * len(linear))))
        if f.dsa_item:
            out.append(StateComp("dsa", [self.mem.zeros(f.kv_pages, f.dsa_item) for _ in f.kv_layers]))
        if f.swa_pages:
            swa = [i for i in range(f.layers) if i not in f.kv_layers]
            item = f.kv_item // attn_tp
            out.append(StateComp("swa", [self.mem.zeros(f.swa_pages, item) for _ in swa * 2]))
        return out

    def _kv_args(self, kv_args: Any, tp_rank: int) -> Any:
        """Field by field as ``prefill.py::PrefillBootstrapQueue._init_kv_manager`` (decode's is the same
        list), with sglang's ``append_state_component`` for every state component."""
        from sglang.srt.disaggregation.base.conn import StateType
        from sglang.srt.disaggregation.utils import append_state_component

        f = self.family
        kv_args.engine_rank = tp_rank
        kv_args.pp_rank = 0
        kv_args.system_dp_rank = 0
        kv_args.rust_http_port = None
        kv_args.kv_cache_dtype_str = "auto"
        kv_args.kv_layout = None
        kv_args.prefill_start_layer = 0
        kv_args.prefill_end_layer = f.layers
        kv_args.kv_data_ptrs = [b.data.data_ptr() for b in self.kv]
        kv_args.kv_data_lens = [b.data.nbytes for b in self.kv]
        kv_args.kv_item_lens = [b.item_len for b in self.kv]
        kv_args.num_draft_entries = 0
        kv_args.kv_layer_ids = list(f.kv_layers) * (1 if f.mla else 2)
        kv_args.page_size = f.page_size
        kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = self.metadata.get_buf_infos()
        kv_args.ib_device = None
        kv_args.gpu_id = 0
        # setup_state_kv_args (disaggregation/utils.py) starts from empty lists, then appends.
        for name in ("state_types", "state_data_ptrs", "state_data_lens", "state_item_lens",
                     "state_dim_per_tensor", "state_slice_outer_counts", "state_layer_ids",
                     "state_conv_shard_groups"):
            setattr(kv_args, name, [])
        kv_args.is_hybrid_mla_backend = False
        kv_args.swa_kv_cache_layout = None
        kv_args.mla_compression_ratios = None
        for comp in self.states:
            append_state_component(
                kv_args, StateType(comp.state_type), [t.data.data_ptr() for t in comp.tensors],
                [t.data.nbytes for t in comp.tensors], [t.item_len for t in comp.tensors],
                comp.dims or None, comp.conv_groups or None, comp.outer_counts or None,
                comp.layer_ids or None,
            )
        return kv_args

    # ---- what the scheduler creates per request ------------------------------------------------
    def sender(self, room: int) -> Any:
        """``prefill.py::PrefillBootstrapQueue.create_sender``."""
        cls = self.get_kv_class(self.backend, self.KVClassType.SENDER)
        return cls(mgr=self.manager, bootstrap_addr=self.bootstrap_addr, bootstrap_room=room,
                   req_has_disagg_prefill_dp_rank=False)

    def receiver(self, room: int) -> Any:
        """``decode.py::DecodePreallocQueue._create_receiver_and_enqueue``."""
        cls = self.get_kv_class(self.backend, self.KVClassType.RECEIVER)
        return cls(mgr=self.manager, bootstrap_addr=self.bootstrap_addr, bootstrap_room=room)

    def take(self, pool: str, size: int, n: int, rng: np.random.Generator) -> list[int]:
        """``n`` free items of ``pool`` (shuffled, never handed out twice), as sglang's allocators."""
        free = self.free.setdefault(pool, rng.permutation(size).tolist())
        assert len(free) >= n, f"{self.role}: {pool} exhausted"
        out, self.free[pool] = free[:n], free[n:]
        return [int(i) for i in out]

    def aux_buffers(self) -> list[Any]:
        return [b.view(_torch().uint8).view(b.shape[0], -1) for b in _aux_tensors(self.metadata)]

    def close(self) -> None:
        self.manager.teardown()
        self.mem.close()


def _aux_tensors(metadata: Any) -> list[Any]:
    """MetadataBuffers' registered tensors in ``get_buf_infos`` order."""
    ptrs = metadata.get_buf_infos()[0]
    by_ptr = {v.data_ptr(): v for v in vars(metadata).values() if hasattr(v, "data_ptr")}
    return [by_ptr[p] for p in ptrs]


def server_args(*, role: str, **fields: Any) -> Any:
    """sglang's own ``ServerArgs`` record for such an engine (not resolved: no model is loaded)."""
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path="pdpair-test-model", disaggregation_mode=role,
                      disaggregation_transfer_backend="pdpair", **fields)


# ---- one room, both roles, in sglang's order ---------------------------------------------------
@dataclass
class Room:
    room: int
    tokens: int
    prefix_tokens: int = 0
    src_pages: list[int] = field(default_factory=list)
    dst_pages: list[int] = field(default_factory=list)
    src_state: list[list[int]] = field(default_factory=list)
    dst_state: list[list[int]] = field(default_factory=list)
    src_aux: int = 0
    dst_aux: int = 0


def plan_room(prefill: Rank, decode: Rank, room: int, tokens: int, rng: np.random.Generator,
              prefix_tokens: int = 0) -> Room:
    """Source and destination items of one request (distinct, shuffled pages, as an allocator's)."""
    f = prefill.family
    pages = -(-tokens // f.page_size)
    r = Room(room, tokens, prefix_tokens)
    r.src_pages = prefill.take("kv", f.kv_pages, pages, rng)
    r.dst_pages = decode.take("kv", f.kv_pages, pages, rng)
    r.src_aux, r.dst_aux = prefill.free_aux.pop(), decode.free_aux.pop()
    skip = prefix_tokens // f.page_size
    for comp in prefill.states:
        n, st = comp.tensors[0].num_items, comp.state_type
        if st == "mamba":  # one slot per request (prefill.py::_mamba_payload)
            src, dst = 1, 1
        elif st == "swa":  # the window's last pages, from decode's prefix on (prefill.py::_swa_payload)
            src = min(pages, 4)
            dst = min(src, pages - skip)
        else:  # dsa: every page after decode's cached prefix (prefill.py::_dsa_pages_payload)
            src, dst = pages, pages - skip
        r.src_state.append(prefill.take(st, n, src, rng))
        r.dst_state.append(decode.take(st, n, dst, rng))
    return r


def fill_source(prefill: Rank, r: Room, rng: np.random.Generator) -> None:
    """What prefill's forward pass would have written: random bytes in every source item."""
    t = _torch()

    def rand(n: int) -> Any:
        return t.from_numpy(rng.integers(0, 256, n, dtype=np.uint8)).to(prefill.kv[0].data.device)

    for b in prefill.kv:
        for p in r.src_pages:
            b.data[p] = rand(b.item_len)
    for comp, items in zip(prefill.states, r.src_state, strict=True):
        for tns in comp.tensors:
            for i in items:
                tns.data[i] = rand(tns.item_len)
    for a in prefill.aux_buffers():
        a[r.src_aux] = rand(a.shape[1])


def move(prefill: Rank, decode: Rank, rooms: list[Room], timeout: float = 30.0,
         abort: dict[int, str] | None = None) -> dict[int, tuple[int, str]]:
    """Run rooms through both roles in sglang's order; returns each room's (decode poll, reason).
    ``abort``: rooms one side aborts mid-room ("prefill" or "decode")."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    abort = abort or {}
    senders = {r.room: prefill.sender(r.room) for r in rooms}
    receivers = {r.room: decode.receiver(r.room) for r in rooms}
    for r in rooms:
        assert decode.manager.try_ensure_parallel_info("127.0.0.1:8998")
        receivers[r.room].init(0)
        state = [np.asarray(s, dtype=np.int32) for s in r.dst_state]
        # decode.py sends mamba as a list of one array (_mamba_payload), the rest as arrays.
        state = [[s] if c.state_type == "mamba" else s for s, c in zip(state, decode.states, strict=True)]
        skip = r.prefix_tokens // decode.family.page_size
        receivers[r.room].send_metadata(np.asarray(r.dst_pages[skip:], dtype=np.int32), r.dst_aux, state,
                                        decode_prefix_len=r.prefix_tokens)
    sent: set[int] = set()
    out: dict[int, tuple[int, str]] = {}
    deadline = time.monotonic() + timeout
    while len(out) < len(rooms) and time.monotonic() < deadline:
        for r in rooms:
            s = senders[r.room]
            # An aborted request (the schedulers' abort paths call ``abort()``), mid-room: once decode's
            # request reached prefill (its bootstrap queue holds the request by then), before prefill sends.
            # A decode abort before prefill heard of the room ends prefill's room at its bootstrap timeout,
            # as with sglang's own backends.
            if r.room not in sent and s.poll() == KVPoll.WaitingForInput:
                side = abort.pop(r.room, None)
                if side == "prefill":
                    s.abort()
                elif side == "decode":
                    receivers[r.room].abort()
                else:
                    _send_chunks(prefill, s, r)
                sent.add(r.room)
            if r.room in out:
                continue
            p = receivers[r.room].poll()
            if p in (KVPoll.Success, KVPoll.Failed):
                reason = ""
                if p == KVPoll.Failed:
                    try:
                        receivers[r.room].failure_exception()
                    except Exception as exc:
                        reason = str(exc)
                out[r.room] = (p, reason)
        time.sleep(0.001)
    for r in rooms:  # prefill's inflight queue sees its rooms finish too
        end = time.monotonic() + 10
        while senders[r.room].poll() not in (KVPoll.Success, KVPoll.Failed) and time.monotonic() < end:
            time.sleep(0.005)
        r.prefill_state = senders[r.room].poll()  # type: ignore[attr-defined]
        senders[r.room].clear()
        receivers[r.room].clear()
    return out


def _send_chunks(prefill: Rank, sender: Any, r: Room, chunk_pages: int = 3) -> None:
    """``finalize_bootstrap`` then ``send_kv_chunk`` per chunk: state indices only with the last."""
    prefix = sender.pop_decode_prefix_len()
    pages = r.src_pages[prefix // prefill.family.page_size:]
    sender.init(len(pages), r.src_aux)
    state = [[np.asarray(s, dtype=np.int32)] if c.state_type == "mamba" else np.asarray(s, dtype=np.int32)
             for s, c in zip(r.src_state, prefill.states, strict=True)]
    chunks = [pages[i:i + chunk_pages] for i in range(0, len(pages), chunk_pages)] or [[]]
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        if sender.should_send_kv_chunk(len(chunk), last):
            sender.send(np.asarray(chunk, dtype=np.int32), state if last else None, num_kv_tokens=None)


def verify(prefill: Rank, decode: Rank, r: Room) -> dict[str, int]:
    """Bytes checked per component; raises AssertionError naming the first wrong item."""
    checked: dict[str, int] = {}
    skip = r.prefix_tokens // prefill.family.page_size

    def same(name: str, src: Any, dst: Any, pairs: list[tuple[int, int]]) -> None:
        for s, d in pairs:
            a, b = src.data[s].cpu().numpy(), dst.data[d].cpu().numpy()
            assert np.array_equal(a, b), f"room {r.room}: {name} item {s}->{d} differs"
            checked[name] = checked.get(name, 0) + a.nbytes

    for i, (src, dst) in enumerate(zip(prefill.kv, decode.kv, strict=True)):
        same("kv", src, dst, list(zip(r.src_pages[skip:], r.dst_pages[skip:], strict=True)))
        for d in r.dst_pages[:skip]:  # decode's cached prefix is not written
            assert not dst.data[d].any(), f"room {r.room}: kv/{i} prefix page {d} was written"
    for comp_s, comp_d, src_items, dst_items in zip(prefill.states, decode.states, r.src_state, r.dst_state,
                                                     strict=True):
        pairs = list(zip(src_items[len(src_items) - len(dst_items):], dst_items, strict=True))
        for src, dst in zip(comp_s.tensors, comp_d.tensors, strict=True):
            same(comp_s.state_type, src, dst, pairs)
    src_aux, dst_aux = prefill.aux_buffers(), decode.aux_buffers()
    for a, b in zip(src_aux, dst_aux, strict=True):
        assert np.array_equal(a[r.src_aux].cpu().numpy(), b[r.dst_aux].cpu().numpy()), f"room {r.room}: aux"
        checked["aux"] = checked.get("aux", 0) + a.shape[1]
    return checked


def untouched(decode: Rank, rooms: list[Room]) -> int:
    """Bytes of decode's pools outside every destination that are not zero (must be 0)."""
    dirty = 0
    kv_dst = {p for r in rooms for p in r.dst_pages}
    for b in decode.kv:
        mask = np.ones(b.num_items, bool)
        mask[list(kv_dst)] = False
        dirty += int(b.data.cpu().numpy()[mask].astype(bool).sum())
    for ci, comp in enumerate(decode.states):
        dst = {i for r in rooms for i in r.dst_state[ci]}
        for tns in comp.tensors:
            mask = np.ones(tns.num_items, bool)
            mask[list(dst)] = False
            dirty += int(tns.data.cpu().numpy()[mask].astype(bool).sum())
    return dirty


# ---- prefill TP 2 -> decode TP 1 ---------------------------------------------------------------
def move_tp(prefills: list[Rank], decode: Rank, rooms: list[Room], timeout: float = 30.0) -> dict[int, int]:
    """``move`` with every prefill TP rank sending the room from its own memory (sglang's prefill TP
    ranks share page and slot indices: each rank's scheduler runs the same allocator)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    senders = {(i, r.room): p.sender(r.room) for i, p in enumerate(prefills) for r in rooms}
    receivers = {r.room: decode.receiver(r.room) for r in rooms}
    for r in rooms:
        receivers[r.room].init(0)
        state = [[np.asarray(s, np.int32)] if c.state_type == "mamba" else np.asarray(s, np.int32)
                 for s, c in zip(r.dst_state, decode.states, strict=True)]
        pages = np.asarray(r.dst_pages, np.int32)
        receivers[r.room].send_metadata(pages, r.dst_aux, state, decode_prefix_len=0)
    sent: set[tuple[int, int]] = set()
    out: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(out) < len(rooms) and time.monotonic() < deadline:
        for (i, room), s in senders.items():
            if (i, room) not in sent and s.poll() == KVPoll.WaitingForInput:
                _send_chunks(prefills[i], s, next(r for r in rooms if r.room == room))
                sent.add((i, room))
        for r in rooms:
            p = receivers[r.room].poll()
            if r.room not in out and p in (KVPoll.Success, KVPoll.Failed):
                out[r.room] = p
        time.sleep(0.001)
    return out


def verify_tp(prefills: list[Rank], decode: Rank, r: Room) -> dict[str, int]:
    """Decode TP 1 holds every prefill rank's TP slice: KV heads per token, mamba conv rows per
    ``conv_shard_groups`` sub-block, temporal heads; aux from rank 0."""
    tp, page, checked = len(prefills), decode.family.page_size, {}
    for b, dst in enumerate(decode.kv):
        for s, d in zip(r.src_pages, r.dst_pages, strict=True):
            got = dst.data[d].cpu().numpy().reshape(page, tp, -1)
            for i, p in enumerate(prefills):
                want = p.kv[b].data[s].cpu().numpy().reshape(page, -1)
                assert np.array_equal(got[:, i, :], want), f"room {r.room}: kv/{b} page {d} rank {i}"
                checked["kv"] = checked.get("kv", 0) + want.nbytes
    for ci, comp in enumerate(decode.states):
        (s,), (d,) = r.src_state[ci], r.dst_state[ci]
        for ti, dst in enumerate(comp.tensors):
            got = dst.data[d].cpu().numpy()
            groups = comp.conv_groups[ti] if comp.conv_groups else None
            rows = groups or [comp.dims[ti]]
            got_rows = got.reshape(sum(rows), -1)
            at = 0
            for gi, full in enumerate(rows):
                part, src_at = full // tp, sum(g // tp for g in rows[:gi])
                for i, p in enumerate(prefills):
                    src = p.states[ci].tensors[ti].data[s].cpu().numpy().reshape(sum(rows) // tp, -1)
                    want = src[src_at:src_at + part]
                    assert np.array_equal(got_rows[at + i * part: at + (i + 1) * part], want), (
                        f"room {r.room}: {comp.state_type}/{ti} slot {d} rank {i}")
                    checked[comp.state_type] = checked.get(comp.state_type, 0) + want.nbytes
                at += full
    for a, b in zip(prefills[0].aux_buffers(), decode.aux_buffers(), strict=True):
        assert np.array_equal(a[r.src_aux].cpu().numpy(), b[r.dst_aux].cpu().numpy()), f"room {r.room}: aux"
        checked["aux"] = checked.get("aux", 0) + a.shape[1]
    return checked
