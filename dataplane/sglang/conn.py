"""The ``pdpair`` transfer backend's classes, as sglang's ``get_kv_class`` hands them out.

They translate; the pod's agent orchestrates. ``PDPairKVManager`` (one per scheduler process) turns
``KVArgs`` into a schema and shared regions and registers them with the agent over the local API;
``PDPairKVSender`` / ``PDPairKVReceiver`` map what ``disaggregation/prefill.py`` and ``decode.py``
call onto ``Send`` / ``Expect`` / ``Poll`` / ``Abort``:

| sglang call | local API |
| --- | --- |
| ``KVManager(kv_args, mode, server_args, is_mla)`` | ``Hello`` + ``RegisterPools`` (every buffer) |
| prefill ``sender.poll()`` before ``send`` | WaitingForInput once the agent pushed decode's request |
| prefill ``sender.init(num_pages, aux)``, ``send(pages, state)`` | one ``Send`` with the last chunk |
| decode ``receiver.send_metadata(pages, aux, state, decode_prefix_len)`` | ``Expect`` (prefix, address) |
| ``poll()`` after that | the room state the agent pushed (already a ``KVPoll``) |
| ``failure_exception()`` | sglang's ``KVTransferError`` with the agent's reason |
| ``abort()`` | ``Abort`` |

The bootstrap room is the local API's room. The prefill agent serves the bootstrap endpoint on the port
sglang is given as its bootstrap port (the bootstrap server class starts nothing), so decode's
``bootstrap_addr`` — the prefill the router picked for the request — names that agent's ``/topology``
as it is, and ``Expect`` carries it: decode's agent pairs with that prefill and sends the room there.
Decode's cached prefix: prefill sends every page of the prompt
(``pop_decode_prefix_len`` stays 0) and the agent skips the KV pages decode holds; a paged state
component computed from decode's prefix (SWA window, DSA suffix) is trimmed to the tail decode asked for.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

import numpy as np
from sglang.srt.disaggregation.base.conn import (
    BaseKVBootstrapServer,
    BaseKVManager,
    BaseKVReceiver,
    BaseKVSender,
    KVPoll,
    KVTransferMetric,
)

from ..codec import encode_manifest, manifest_from_schema
from ..errors import AgentUnavailable, LocalApiError, PDPairError
from ..localapi import AgentClient, RoomState
from ..schema import SendRule
from .layout import Unsupported, layout_from_kvargs
from .memory import share
from .settings import Settings
from .support import check_server_args, engine_topology

log = logging.getLogger(__name__)
KEEP_ASKED = 65536
"""Rooms decode asked for whose request the prefill manager remembers (oldest forgotten first)."""


class PrefillInfo:
    """What decode.py reads of ``prefill_info_table``: one prefill DP rank, rooms follow it."""

    dp_size = 1
    follow_bootstrap_room = True


class PDPairKVManager(BaseKVManager):
    def __init__(
        self, args: Any, disaggregation_mode: Any, server_args: Any, is_mla_backend: bool | None = False
    ):
        self.kv_args = args
        self.role = str(getattr(disaggregation_mode, "value", disaggregation_mode))
        if self.role not in ("prefill", "decode"):
            raise Unsupported(f"pdpair: mode {self.role!r} moves nothing; use prefill or decode")
        self.settings = Settings.from_environment()
        check_server_args(server_args, self.role)
        self.topology = engine_topology(server_args, int(args.engine_rank))
        model = str(getattr(server_args, "served_model_name", None) or getattr(server_args, "model_path", ""))
        layout = layout_from_kvargs(
            args, model=model, tp_size=self.topology.attn_tp_size, tp_rank=self.topology.attn_tp_rank,
            is_mla=bool(is_mla_backend),
        )
        self.schema = layout.schema
        self.regions, self.fds = share(layout.schema, layout.buffers, int(getattr(args, "gpu_id", 0)))
        manifest = encode_manifest(manifest_from_schema(layout.schema, role=self.role))  # type: ignore[arg-type]
        self.client = AgentClient(
            self.settings.socket_path, role=self.role, manifest=manifest,
            engine_id=f"sglang-{self.role}-tp{self.topology.tp_rank}", timeout=self.settings.call_timeout,
            tp_rank=self.topology.tp_rank, tp_size=self.topology.tp_size, dp_size=self.topology.dp_size,
        )
        self.asked: OrderedDict[int, tuple[RoomState, float]] = OrderedDict()
        self.prefill_info_table: dict[str, PrefillInfo] = {}
        self.transfer_infos: dict[int, Any] = {}
        self._register()

    def _register(self) -> None:
        """Hand the pools to the agent; an agent not up yet gets them when the client reconnects.
        Connect first: ``register_pools`` on an unconnected client registers while it connects."""
        try:
            if not self.client.connected:
                self.client.connect()
            self.client.register_pools(self.regions, self.fds)
        except AgentUnavailable as exc:
            log.warning("pdpair: %s; the pools are registered once it is up", exc)
        except LocalApiError as exc:
            where = self.settings.socket_path
            raise Unsupported(f"pdpair: the agent at {where} refused this engine: {exc}") from None

    def register_to_bootstrap(self) -> None:
        """Nothing to do: the prefill agent serves the bootstrap endpoint and announces every rank."""

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        """Decode: the agent learns prefill's topology itself; sglang only needs a prefill DP size."""
        self.prefill_info_table.setdefault(bootstrap_addr, PrefillInfo())
        return True

    def decode_asked(self, room: int) -> tuple[RoomState, float] | None:
        """Prefill: decode's request for ``room`` (its item counts, when it arrived), if it came."""
        for st in self.client.take_incoming():
            self.asked[st.room] = (st, time.monotonic())
            while len(self.asked) > KEEP_ASKED:
                self.asked.popitem(last=False)
        return self.asked.get(room)

    def forget(self, room: int) -> None:
        self.asked.pop(room, None)
        self.client.forget(room)

    def clear_deferred_abort_state(self, room: int) -> None:
        """No deferred release: an aborted room's destinations are never written after its Failed."""

    def is_abort_release_safe(self, *args: Any) -> bool:
        return True

    def teardown(self) -> None:
        self.client.close()


class _Room:
    """What a sender and a receiver share: the room, its concluded state and reason."""

    def __init__(self, mgr: PDPairKVManager, bootstrap_addr: str, bootstrap_room: int | None):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = int(bootstrap_room or 0)
        self.conclude_state: int | None = None
        self.reason = ""

    def _conclude(self, state: int, reason: str = "") -> int:
        self.conclude_state, self.reason = state, reason
        return state

    def _agent_state(self) -> int:
        """The agent's state of the room, concluded once terminal."""
        state, reason = self.kv_mgr.client.poll(self.bootstrap_room)
        if state in (KVPoll.Failed, KVPoll.Success):
            return self._conclude(state, reason)
        return max(state, KVPoll.WaitingForInput)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except PDPairError as exc:
            self._conclude(KVPoll.Failed, f"{what}: {exc}")

    def failure_exception(self) -> None:
        from sglang.srt.disaggregation.common.conn import KVTransferError

        raise KVTransferError(self.bootstrap_room, self.reason or "pdpair: transfer failed")

    def get_transfer_metric(self) -> KVTransferMetric:
        return KVTransferMetric()

    def abort(self) -> None:
        if self.conclude_state is None:
            try:
                self.kv_mgr.client.abort(self.bootstrap_room, "aborted by sglang")
            except PDPairError as exc:
                log.debug("pdpair: abort of room %d not delivered: %s", self.bootstrap_room, exc)
            self._conclude(KVPoll.Failed, "aborted by sglang")

    def clear(self) -> None:
        self.kv_mgr.forget(self.bootstrap_room)


class PDPairKVSender(_Room, BaseKVSender):
    def __init__(self, mgr: PDPairKVManager, bootstrap_addr: str, bootstrap_room: int,
                 req_has_disagg_prefill_dp_rank: bool = False):
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.created = time.monotonic()
        self.num_pages: int | None = None
        self.aux_index: int | None = None
        self.pages: list[np.ndarray] = []
        self.sent = False

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None:
        self.num_pages, self.aux_index = int(num_kv_indices), aux_index

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        """A zero-page last chunk still sends: the room goes to the agent with the last chunk."""
        return num_pages > 0 or last_chunk

    def send(self, kv_indices: Any, state_indices: list[Any] | None = None,
             num_kv_tokens: int | None = None, **_: Any) -> None:
        if self.conclude_state is not None or self.sent:
            return
        self.pages.append(np.asarray(kv_indices, dtype=np.int32).ravel())
        done = sum(len(p) for p in self.pages)
        if self.num_pages is not None and done < self.num_pages:
            return
        kv = np.concatenate(self.pages) if self.pages else np.zeros(0, np.int32)
        self.sent = True
        self._call("send", self.kv_mgr.client.send, self.bootstrap_room, kv, self.aux_index,
                   self._state(state_indices))

    def _state(self, state_indices: list[Any] | None) -> list[np.ndarray | None]:
        """One index array per component; a paged component decode asked fewer items of (its cached
        prefix shortened its window / suffix) is cut to the tail decode asked for."""
        asked = self.kv_mgr.decode_asked(self.bootstrap_room)
        counts = asked[0].state_items if asked else ()
        out: list[np.ndarray | None] = []
        for ci, comp in enumerate(self.kv_mgr.schema.components):
            raw = state_indices[ci] if state_indices and ci < len(state_indices) else None
            if raw is None:
                out.append(None)
                continue
            arr = _flat(raw)
            if comp.info.rule is SendRule.PAGED and ci < len(counts) and len(arr) > counts[ci]:
                arr = arr[len(arr) - counts[ci]:]
            out.append(arr)
        return out

    def poll(self) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        if self.sent:
            return self._agent_state()
        failed = self.kv_mgr.client.failed_unsent(self.bootstrap_room)
        if failed is not None:
            return self._conclude(KVPoll.Failed, failed)
        asked = self.kv_mgr.decode_asked(self.bootstrap_room)
        now = time.monotonic()
        if asked is None:
            if now - self.created > self.kv_mgr.settings.bootstrap_timeout:
                return self._conclude(KVPoll.Failed, "pdpair: decode did not ask for the room within "
                                      f"{self.kv_mgr.settings.bootstrap_timeout:.0f}s")
            return KVPoll.Bootstrapping
        if self.num_pages is not None and now - asked[1] > self.kv_mgr.settings.waiting_timeout:
            return self._conclude(KVPoll.Failed, "pdpair: no KV sent within "
                                  f"{self.kv_mgr.settings.waiting_timeout:.0f}s of decode's request")
        return KVPoll.WaitingForInput


class PDPairKVReceiver(_Room, BaseKVReceiver):
    def __init__(self, mgr: PDPairKVManager, bootstrap_addr: str, bootstrap_room: int | None = None):
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self.bootstrap_done = False
        self.expected = False
        self.abort_notified = False
        self.bootstrap_infos: list[Any] = []
        self.require_staging = False

    def init(self, prefill_dp_rank: int) -> None:
        self.bootstrap_done = True

    def send_metadata(
        self, kv_indices: Any, aux_index: int | None = None, state_indices: list[Any] | None = None,
        decode_prefix_len: int | None = None, destination: Any = None, **_: Any,
    ) -> None:
        if str(getattr(destination, "value", destination or "device")) != "device":
            self._conclude(KVPoll.Failed, "pdpair: host KV destinations are not supported")
            return
        state = [None if s is None else _flat(s) for s in (state_indices or [])]
        self.expected = True
        self._call("expect", self.kv_mgr.client.expect, self.bootstrap_room,
                   np.asarray(kv_indices, dtype=np.int32).ravel(), aux_index, state,
                   prefix_len=int(decode_prefix_len or 0), bootstrap_addr=self.bootstrap_addr)

    def poll(self) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        if not self.bootstrap_done:
            return KVPoll.Bootstrapping
        if not self.expected:
            return KVPoll.WaitingForInput
        return self._agent_state()

    def ensure_abort_notified(self, *, force_arm: bool = False) -> None:
        """The agent tells prefill of an abort itself."""

    def is_abort_release_safe(self) -> bool:
        return True


class PDPairKVBootstrapServer(BaseKVBootstrapServer):
    """Starts nothing: the prefill pod's agent serves the bootstrap endpoint on its own port (the
    port the router names for this prefill)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        log.info("pdpair: the pod's PDPair agent serves bootstrap; sglang's port %d stays unused", port)

    def close(self) -> None:
        """Nothing to stop."""


def _flat(raw: Any) -> np.ndarray:
    """sglang's per-component indices (an array, a list of arrays for mamba, a tensor) as int32."""
    if isinstance(raw, list | tuple) and raw and not np.isscalar(raw[0]):
        parts = [np.asarray(_cpu(r), dtype=np.int32).ravel() for r in raw]
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return np.asarray(_cpu(raw), dtype=np.int32).ravel()


def _cpu(x: Any) -> Any:
    return x.cpu().numpy() if hasattr(x, "cpu") else x
