"""One sglang scheduler rank's disaggregation side, driven as sglang 0.5.23 drives it, minus the model.

A rank holds sglang's own pools, built by ``build_pools`` with the classes and arguments sglang's
``KVCacheConfigurator`` uses: ``HybridReqToTokenPool`` (its ``MambaPool``, shaped by sglang's own
``Qwen3NextConfig.mamba2_cache_params``) + ``HybridLinearKVPool`` for Qwen3-Next, ``DSATokenToKVPool``
(MLA + DSA index keys) for DeepSeek-V3.2, ``SWAKVPool`` over two ``MHATokenToKVPool`` for gpt-oss; all
of them run on CPU (``device="cpu"``) and on CUDA. ``KVArgs`` is filled as
``disaggregation/prefill.py::PrefillBootstrapQueue._init_kv_manager`` and
``decode.py::DecodePreallocQueue._init_kv_manager`` fill it, the pools read by sglang's own
``get_kv_transfer_buf_infos`` / ``build_kv_layer_ids`` / ``setup_state_kv_args``
(``get_contiguous_buf_infos``, ``get_state_buf_infos``, ``get_state_dim_per_tensor``,
``get_state_conv_shard_groups``, ... underneath)
and sglang's own ``MetadataBuffers.get_buf_infos`` for aux.
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

Prefill fills its source items with random bytes through views on the pools' own storage; decode checks
every destination byte per component and that nothing outside its destinations was written.
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
    """A model family: the sglang pool its model runner builds, at test scale (token counts), with the
    model's per-token geometry (heads, head dims, MLA ranks) where the CPU suite can afford it."""

    name: str
    pool: str  # "hybrid_linear" (Mamba/GDN + MHA), "dsa" (MLA + index keys), "swa" (full + sliding MHA)
    layers: int
    page_size: int = 16
    kv_tokens: int = 1024
    full_layers: tuple[int, ...] = ()
    kv_heads: int = 2
    head_dim: int = 64
    mamba_slots: int = 0
    swa_tokens: int = 0

    @property
    def kv_pages(self) -> int:
        return self.kv_tokens // self.page_size


# Qwen3-Next: 2 KV heads of 256 (real); its GDN layers scaled down (real: 16 key / 32 value heads of 128).
QWEN3_NEXT = Family("qwen3-next", "hybrid_linear", layers=8, full_layers=(3, 7), kv_heads=2, head_dim=256,
                    mamba_slots=8)
# DeepSeek-V3.2: MLA rank 512 + rope 64, index keys of 128, 64-token pages (DSATokenToKVPool requires it).
DEEPSEEK_V32 = Family("deepseek-v3.2", "dsa", layers=4, page_size=64, kv_tokens=4096)
# gpt-oss: 8 KV heads of 64; full attention on odd layers, a sliding window on even ones.
GPT_OSS = Family("gpt-oss", "swa", layers=4, full_layers=(1, 3), kv_heads=8, head_dim=64, swa_tokens=512)
FAMILIES = {f.name: f for f in (QWEN3_NEXT, DEEPSEEK_V32, GPT_OSS)}


def build_pools(family: Family, attn_tp: int, device: str) -> tuple[Any, Any]:
    """sglang's own pool classes, with the arguments ``mem_cache/kv_cache_configurator.py`` passes
    (``_build_hybrid_req_pool`` + ``_build_hybrid_linear_kv_pool``, ``_build_dsa_kv_pool``,
    ``_build_hybrid_swa_kv_pool``), on ``device``. Returns (token_to_kv_pool, req_to_token_pool or
    None). The parallel widths the pools read are stated with sglang's ``get_parallel().override``, as
    no process groups exist here."""
    from sglang.srt.mem_cache.memory_pool import (
        DSATokenToKVPool,
        HybridLinearKVPool,
        HybridReqToTokenPool,
        MHATokenToKVPool,
    )
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.runtime_context import get_parallel

    t, f = _torch(), family
    with get_parallel().override(attn_tp_size=attn_tp, attn_dcp_size=1, enable_cp_tp_group_sharing=False):
        if f.pool == "hybrid_linear":
            from sglang.srt.configs.qwen3_next import Qwen3NextConfig

            config = Qwen3NextConfig(
                num_hidden_layers=f.layers, full_attention_interval=f.full_layers[0] + 1,
                num_key_value_heads=f.kv_heads, head_dim=f.head_dim, linear_num_key_heads=4,
                linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32,
                linear_conv_kernel_dim=4,
            )
            assert tuple(config.full_attention_layer_ids) == f.full_layers
            req_pool = HybridReqToTokenPool(
                size=f.mamba_slots, mamba_size=f.mamba_slots, mamba_spec_state_size=f.mamba_slots,
                max_context_len=f.kv_tokens, device=device, enable_memory_saver=False,
                cache_params=config.mamba2_cache_params, mamba_layer_ids=config.linear_layer_ids,
                enable_mamba_extra_buffer=False,
            )
            pool = HybridLinearKVPool(
                size=f.kv_tokens, dtype=t.bfloat16, page_size=f.page_size, head_num=f.kv_heads // attn_tp,
                head_dim=f.head_dim, full_attention_layer_ids=list(f.full_layers), device=device,
                mamba_pool=req_pool.mamba_pool,
            )
            return pool, req_pool
        if f.pool == "dsa":
            return DSATokenToKVPool(
                f.kv_tokens, page_size=f.page_size, dtype=t.bfloat16, kv_lora_rank=512,
                qk_rope_head_dim=64, layer_num=f.layers, device=device, enable_memory_saver=False,
                kv_cache_dim=576, index_head_dim=128,
            ), None
        swa = [i for i in range(f.layers) if i not in f.full_layers]
        return SWAKVPool(
            size=f.kv_tokens, size_swa=f.swa_tokens, page_size=f.page_size, dtype=t.bfloat16,
            head_num=f.kv_heads // attn_tp, head_dim=f.head_dim, swa_attention_layer_ids=swa,
            full_attention_layer_ids=list(f.full_layers), device=device, enable_kv_cache_copy=False,
            token_to_kv_pool_class=MHATokenToKVPool, enable_memory_saver=False,
        ), None


class Rank:
    """One scheduler rank of one role: sglang's pools, its ``KVArgs``, the pdpair manager and its rooms.

    On a CPU rank the pools' storage moves into a PDPair host arena (``dataplane.sglang.memory.rehome``)
    before ``KVArgs`` is read, as the agent can map no private host memory; on CUDA the pools stay where
    sglang allocated them and go by IPC handle."""

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

        from dataplane.sglang.memory import rehome

        t = _torch()
        self.role, self.family, self.device = role, family, device
        self.bootstrap_addr = bootstrap_addr
        self.backend = TransferBackend("pdpair")
        self.get_kv_class, self.KVClassType = get_kv_class, KVClassType
        self.pool, self.req_pool = build_pools(family, tp_size // dp_size, device)
        self.arenas = [a for a in (rehome(self.pool), self.req_pool and rehome(self.req_pool))
                       if device == "cpu" and a is not None]
        # sglang's own MetadataBuffers (the plugin's hook moves its tensors where the agent reaches them).
        self.metadata = MetadataBuffers(aux_slots, hidden_size=64, hidden_states_dtype=t.bfloat16,
                                        max_sampling_mask_tokens=16, max_top_logprobs_num=8)
        self.free_aux = list(range(aux_slots))
        self.free: dict[str, list[int]] = {}
        self.kv_args = self._kv_args(get_kv_class(self.backend, KVClassType.KVARGS)(), tp_rank)
        self.kv, self.states = self._views()
        manager_class = get_kv_class(self.backend, KVClassType.MANAGER)
        mode = DisaggregationMode.PREFILL if role == "prefill" else DisaggregationMode.DECODE
        args = {"tp_size": tp_size, "attn_dp_size": dp_size} | (server_overrides or {})
        self.server_args = server_args(role=role, **args)
        self.manager = manager_class(self.kv_args, mode, self.server_args, family.pool == "dsa")

    def _kv_args(self, kv_args: Any, tp_rank: int) -> Any:
        """Field by field as ``prefill.py::PrefillBootstrapQueue._init_kv_manager`` (0.5.23 lines
        257-357; ``decode.py::DecodePreallocQueue._init_kv_manager``, lines 600-690, is the same list),
        with sglang's own ``get_kv_transfer_buf_infos``, ``build_kv_layer_ids`` and
        ``setup_state_kv_args`` (``disaggregation/utils.py``) reading the pools."""
        from sglang.srt.disaggregation.utils import (
            build_kv_layer_ids,
            get_kv_transfer_buf_infos,
            setup_state_kv_args,
        )

        pool, f = self.pool, self.family
        kv_args.engine_rank = tp_rank
        kv_args.pp_rank = 0
        kv_args.system_dp_rank = 0
        kv_args.rust_http_port = None
        kv_args.kv_cache_dtype_str = "auto"
        kv_args.kv_layout = None  # get_pd_kv_layout: None but for DeepSeek-V4 pools
        kv_args.prefill_start_layer = 0  # _transfer_start_layer: the pools start at layer 0
        kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = get_kv_transfer_buf_infos(pool)
        kv_args.prefill_end_layer = getattr(pool, "end_layer", None)
        kv_args.num_draft_entries = 0
        kv_args.kv_layer_ids = build_kv_layer_ids(token_to_kv_pool=pool, draft_token_to_kv_pool=None,
                                                  num_draft_entries=0, num_hidden_layers=f.layers)
        if f.pool != "dsa":
            kv_args.kv_head_num = pool.head_num
            kv_args.total_kv_head_num = f.kv_heads
        kv_args.page_size = pool.page_size
        kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = self.metadata.get_buf_infos()
        kv_args.ib_device = None
        kv_args.gpu_id = 0
        setup_state_kv_args(kv_args, pool, None, f.layers, req_to_token_pool=self.req_pool)
        return kv_args

    def _views(self) -> tuple[list[Tensor], list[StateComp]]:
        """A uint8 ``[items, item_len]`` view of every buffer ``KVArgs`` registers, on the pools' own
        storage (found among the tensors the pools hold): what prefill fills and decode checks."""
        from dataplane.sglang.memory import tensors_of

        t, a = _torch(), self.kv_args
        storages = {s.data_ptr(): s for s in (x.untyped_storage() for x in
                                              tensors_of(self.pool) + tensors_of(self.req_pool))}

        def view(ptr: int, nbytes: int, item_len: int) -> Tensor:
            base = max((p for p, s in storages.items() if p <= ptr < p + s.nbytes()), default=None)
            assert base is not None, f"{self.role}: no pool tensor holds {ptr:#x}"
            out = t.empty(0, dtype=t.uint8, device=storages[base].device)
            return Tensor(out.set_(storages[base], ptr - base, (nbytes // item_len, item_len)))

        kv = [view(*b) for b in zip(a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens, strict=True)]
        states = [
            StateComp(str(getattr(st, "value", st)),
                      [view(*b) for b in zip(a.state_data_ptrs[ci], a.state_data_lens[ci],
                                             a.state_item_lens[ci], strict=True)],
                      dims=list(a.state_dim_per_tensor[ci]), layer_ids=list(a.state_layer_ids[ci]),
                      conv_groups=list(a.state_conv_shard_groups[ci]),
                      outer_counts=list(a.state_slice_outer_counts[ci]))
            for ci, st in enumerate(a.state_types)
        ]
        return kv, states

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
        self.kv, self.states = [], []
        for arena in self.arenas:
            arena.close()


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
