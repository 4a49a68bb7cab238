"""The synthetic engine as its own process: an engine that speaks the local API to its sidecar agent.

It stands where sglang or vLLM would: it allocates its pools in shared memory (``SharedPools``), hands
them to the agent (``AgentClient.register_pools``), owns every item index, and drives rooms. Content
and verification are the agent's own deterministic synthetic engine (``agent.synthetic``), applied
to the engine's pools, so a byte misplaced anywhere between the two engines fails verification.

- decode originates the request stream (like a router): allocate destination items for ``tokens`` →
  ``expect`` → wait → verify every component → free. A failed room's destination items are
  quarantined for one transfer timeout (a late write must not land in a reused item).
- prefill reacts: each room decode asks for arrives as WaitingForInput with its item counts →
  allocate source items → fill ("forward pass") → ``send`` → free when the room finishes.

When the agent is down, calls fail with ``AgentUnavailable``: the engine counts it, backs off and
keeps going; the client re-registers the pools when the agent is back.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..agent.pools import IndexAllocator, MemoryPools, give_items
from ..agent.synthetic import SyntheticEngine, items_for_tokens
from ..codec import KVPoll, encode_manifest, manifest_from_schema
from ..config import AgentConfig
from ..errors import AgentUnavailable, LocalApiError, PDPairError
from ..localapi import AgentClient, RoomState, SharedPools
from ..schema import RoleSchema
from ..schema.profiles import schema_from_config

log = logging.getLogger(__name__)
KEEP_FAILURES = 64
Items = tuple[np.ndarray, int | None, list[np.ndarray | None]]


class SyntheticEngineProcess:
    def __init__(
        self,
        cfg: AgentConfig,
        socket_path: str,
        *,
        shm_mode: Literal["fd", "shm"] = "fd",
        timeout: float = 5.0,
        room_base: int | None = None,
        schema: RoleSchema | None = None,
    ):
        """``schema``: the layout to allocate (a serving engine's pools as an agent adopted them, to
        compare the two engines on one layout); default: the config's profile or components."""
        self.cfg, self.role = cfg, cfg.role
        self.schema = schema or schema_from_config(cfg.attention_view())
        regions = [(r.name, r.component, r.tensor, r.size) for r in self.schema.regions()]
        if cfg.transfer.device == "cuda":
            from .cuda_pools import CudaPools

            self.shared: SharedPools | CudaPools = CudaPools(regions, cfg.transfer.gpu_id)
            self.pools = MemoryPools.adopt(self.schema, self.shared.buffers, "cuda", cfg.transfer.gpu_id)
        else:
            self.shared = SharedPools(
                regions, mode=shm_mode, prefault=cfg.model.prefault, huge_pages=cfg.localapi.engine.huge_pages
            )
            if self.shared.huge:
                log.info("pools: %d MiB in 2 MiB huge pages", self.shared.size >> 20)
            else:
                log.info("pools: ordinary shared pages (%s)", self.shared.huge_reason)
            self.pools = MemoryPools.adopt(self.schema, self.shared.buffers)
        self.synthetic = SyntheticEngine(self.pools)
        manifest = manifest_from_schema(self.schema, role=self.role, generation=cfg.identity.generation)
        self.client = AgentClient(
            socket_path, role=self.role, manifest=encode_manifest(manifest), timeout=timeout,
            engine_id=f"synthetic-{self.role}-{cfg.tp_rank}", tp_rank=cfg.tp_rank, tp_size=cfg.tp_size,
            dp_size=cfg.dp_size,
        )
        self.kv = IndexAllocator("kv", self.schema.kv.num_pages)
        self.aux = IndexAllocator("aux", self.schema.aux.num_items)
        self.state = [IndexAllocator(c.name, c.num_items) for c in self.schema.components]
        self.inflight: dict[int, tuple[Items, float]] = {}
        self.quarantine: list[tuple[float, Items]] = []
        self.counts: Counter[str] = Counter()
        self.failures: dict[str, str] = {}
        """Each failed room's reason, by room id (the first ``KEEP_FAILURES``): a failure explains itself."""
        self.components: dict[str, dict[str, Any]] = {}
        self.made = 0
        self.room_base = random.getrandbits(40) << 20 if room_base is None else room_base
        self.last_error = ""
        self.registered = False
        self.verify_rooms = True
        self.presend = 0
        """Prefill: rooms to send ahead of decode's request (0: react to decode's requests)."""
        self.poll_seconds = 0.0
        """With nothing to do, look for the agent's pushes this long without sleeping (a serving
        engine's scheduler loop polls its connector every iteration; 0: block at once)."""
        self.next_request = 0.0
        self.bytes = 0
        self.api_seconds = 0.0
        self.api_calls = 0
        self.first_start = self.last_end = 0.0
        self.warm: set[int] = set()

    # ---- items ---------------------------------------------------------------------------------
    def take(self, kv: int, aux: bool, state: tuple[int, ...]) -> Items | None:
        got_kv = self.kv.take(kv)
        got_aux = self.aux.take(1) if aux else np.empty(0, np.int32)
        got_state = [
            a.take(n) if n else np.empty(0, np.int32) for a, n in zip(self.state, state, strict=False)
        ]
        items: Items = (
            got_kv if got_kv is not None else np.empty(0, np.int32),
            int(got_aux[0]) if got_aux is not None and len(got_aux) else None,
            [s if s is not None and len(s) else None for s in got_state],
        )
        if got_kv is None or got_aux is None or any(s is None for s in got_state):
            self.give(items)
            return None
        items[2].extend([None] * (len(self.state) - len(items[2])))
        return items

    def give(self, items: Items) -> None:
        give_items(self.kv, self.aux, self.state, *items)

    # ---- loop ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event, *, requests: int, tokens: tuple[int, ...], max_inflight: int,
            duration: float = 0.0, report: str | None = None) -> dict[str, Any]:
        """Drive rooms until ``requests`` are done (decode), ``duration`` passed, or ``stop``."""
        self.started = time.monotonic()
        end = self.started + duration if duration else float("inf")
        next_report = 0.0
        while not stop.is_set() and time.monotonic() < end:
            if self.role == "decode" and requests and self.counts["finished"] >= requests:
                break
            try:
                self.step(requests, tokens, max_inflight)
            except AgentUnavailable as exc:
                self.unavailable(exc)
            now = time.monotonic()
            if report and now >= next_report:
                self.write_report(report)
                next_report = now + 0.5
        summary = self.summary()
        if report:
            self.write_report(report)
        return summary

    def connect(self) -> None:
        """First contact: connect and register the pools (the client re-registers them by itself
        after an agent restart)."""
        if not self.registered:
            self.client.connect()
            self.client.register_pools(self.shared.regions, self.shared.fds)
            self.registered = True
        elif not self.client.connected:
            self.client.ensure_connected()
            self.counts["reconnects"] += 1

    def unavailable(self, exc: AgentUnavailable) -> None:
        if str(exc) != self.last_error:
            log.warning("agent unavailable: %s", exc)
        self.last_error = str(exc)
        self.counts["unavailable_calls"] += 1
        self.reap()
        time.sleep(self.client.reconnect_interval / 2)

    def step(self, requests: int, tokens: tuple[int, ...], max_inflight: int) -> None:
        """One turn: finish what finished, start what may start (in that order: a finished room's
        items and in-flight slot go to the next request at once), else wait for the agent."""
        self.connect()
        reaped = self.reap()
        seen, made = self.client.version, self.made
        if self.role == "decode":
            while self.may_start(requests, max_inflight):
                if not self.expect_one(tokens[self.made % len(tokens)] if tokens else 0):
                    break
        elif self.presend:
            self.client.take_incoming()
            while len(self.inflight) < self.presend and (not requests or self.made < requests):
                if not self.send_ahead(tokens[self.made % len(tokens)] if tokens else 0):
                    break
        else:
            for st in self.client.take_incoming():
                self.send_one(st)
        if not reaped and self.made == made:
            self.client.wait_change(seen, 0.05, self.poll_seconds)

    def may_start(self, requests: int, max_inflight: int) -> bool:
        """Room for another request: under the in-flight cap, the count, and the canary's rate
        (``synthetic.requestsPerSecond``; 0 = as fast as the cap allows)."""
        if len(self.inflight) >= max_inflight or (requests and self.made >= requests):
            return False
        if self.warm and self.made >= self.cfg.synthetic.warmup:
            return False  # the counted requests start once the warm-up ones are done (as decode's agent)
        rate, now = self.cfg.synthetic.requests_per_second, time.monotonic()
        if rate <= 0:
            return True
        if now < self.next_request:
            return False
        self.next_request = max(self.next_request + 1 / rate, now - 1.0)
        return True

    def expect_one(self, ntokens: int) -> bool:
        counts = items_for_tokens(self.schema, ntokens)
        items = self.take(counts.kv, counts.aux > 0, counts.state)
        if items is None:
            return False
        room = self.room_base + self.made
        start = time.perf_counter()
        try:
            self.client.expect(room, items[0], items[1], items[2])
        except (AgentUnavailable, LocalApiError):
            self.give(items)
            raise
        self.started_room(room, items, start)
        return True

    def started_room(self, room: int, items: Items, start: float) -> None:
        """Account one local API request (its call time) and track its room. The first
        ``synthetic.warmup`` rooms stay out of the transfer window and bytes: they wait for the agents
        to pair and pay one-time costs."""
        self.api_seconds += time.perf_counter() - start
        self.api_calls += 1
        if self.made < self.cfg.synthetic.warmup:
            self.warm.add(room)
        else:
            self.first_start = self.first_start or start
        self.made += 1
        self.inflight[room] = (items, start)

    def send_ahead(self, ntokens: int) -> bool:
        """Prefill told the request stream up front (``presend``, like a router that hands the same
        request to both sides): send room ``room_base + made`` before decode asks for it."""
        counts = items_for_tokens(self.schema, ntokens)
        items = self.take(counts.kv, counts.aux > 0, counts.state)
        if items is None:
            return False
        room = self.room_base + self.made
        if self.verify_rooms:
            self.synthetic.fill(room, *items)
        start = time.perf_counter()
        self.client.send(room, items[0], items[1], items[2])
        self.started_room(room, items, start)
        return True

    def send_one(self, st: RoomState) -> None:
        items = self.take(st.kv_items, st.aux, st.state_items)
        if items is None:
            self.counts["pool_exhausted"] += 1
            self.client.abort(st.room, "prefill engine pools exhausted")
            return
        if self.verify_rooms:
            self.synthetic.fill(st.room, *items)
        start = time.perf_counter()
        self.client.send(st.room, items[0], items[1], items[2])
        self.started_room(st.room, items, start)

    def reap(self) -> int:
        """Finish every room the agent (or a lost connection) has finished; returns how many."""
        done = 0
        now = time.monotonic()
        while self.quarantine and self.quarantine[0][0] <= now:
            self.give(self.quarantine.pop(0)[1])
        rooms = list(self.inflight)
        for room, (state, reason) in zip(rooms, self.client.poll_many(rooms), strict=True):
            if state not in (KVPoll.Success, KVPoll.Failed):
                continue
            items = self.inflight[room][0]
            del self.inflight[room]
            self.client.forget(room)
            warm = room in self.warm
            self.warm.discard(room)
            done += 1
            self.counts["finished"] += 1
            if state == KVPoll.Failed:
                self.counts["failed"] += 1
                self.counts[f"failed: {reason.split(':')[0]}"] += 1
                if len(self.failures) < KEEP_FAILURES:
                    self.failures[str(room)] = reason
                if self.role == "decode":
                    self.quarantine.append((now + self.cfg.transfer.timeout_seconds, items))
                else:
                    self.give(items)
                continue
            self.counts["succeeded"] += 1
            if not warm:
                self.counts["measured"] += 1
                self.last_end = time.perf_counter()
                self.bytes += sum(n for _, _, n in self.synthetic.sizes(*items))
            if self.role == "decode" and self.verify_rooms:
                self.verify(room, items)
            self.give(items)
        return done

    def verify(self, room: int, items: Items) -> None:
        ok = True
        for c in self.synthetic.verify(room, *items):
            per = self.components.setdefault(
                c.component, {"state_type": c.state_type, "bytes": 0, "ok": 0, "bad": 0}
            )
            per["bytes"] += c.bytes
            per["ok" if c.ok else "bad"] += 1
            ok = ok and c.ok
        self.counts["verified" if ok else "verification_failures"] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "made": self.made,
            "inflight": len(self.inflight),
            "connected": self.client.connected,
            "connections": self.client.connections,
            "seconds": round(time.monotonic() - self.started, 3),
            "counts": dict(self.counts),
            "components": self.components,
            "failures": self.failures,
            "bytes": self.bytes,
            "window_seconds": round(max(0.0, self.last_end - self.first_start), 6),
            "api_us_per_call": round(self.api_seconds / self.api_calls * 1e6, 2) if self.api_calls else None,
            "last_error": self.last_error,
            "huge_pages": getattr(self.shared, "huge", False),
        }

    def write_report(self, path: str) -> None:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(self.summary()))
        tmp.replace(path)

    def close(self) -> None:
        self.client.close()
        self.synthetic = None  # type: ignore[assignment]
        self.pools = None  # type: ignore[assignment]
        self.shared.close()


__all__ = ["PDPairError", "SyntheticEngineProcess"]
