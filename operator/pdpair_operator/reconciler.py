"""The per-PDPair work loop: observe (from kopf's in-memory indices) → plan → apply.

Events only *kick* a key; the loop coalesces kicks, so a burst of pod events for one PDPair costs one
or two passes, and at most one pass per PDPair runs at a time (no duplicate creates from racing
handlers). Failed API steps requeue the key with exponential backoff; a plan's own ``requeue_after``
(a failed pod waiting out its backoff) becomes a timer. Nothing lists the world.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from .apply import Executor
from .identity import DEFAULT_AGENT_CLUSTER_ROLE
from .metrics import OperatorMetrics
from .observe import ChildView, Owner, PodView
from .planner import Observed, plan, rfc3339
from .spec import SpecError

log = logging.getLogger(__name__)
Key = tuple[str, str]
ERROR_BACKOFF_CAP_SECONDS = 60.0


class Indices:
    """Live views of kopf's indices (key → values); kopf keeps them current from its watches."""

    def __init__(self) -> None:
        self.owners: Mapping[Key, Iterable[Owner | None]] = {}
        self.pods: Mapping[Key, Iterable[PodView]] = {}
        self.services: Mapping[Key, Iterable[ChildView]] = {}
        self.configmaps: Mapping[Key, Iterable[ChildView]] = {}
        self.claim_templates: Mapping[Key, Iterable[ChildView]] = {}
        self.secrets: Mapping[Key, Iterable[ChildView]] = {}
        self.network_policies: Mapping[Key, Iterable[ChildView]] = {}
        self.extra: tuple[Mapping[Key, Iterable[ChildView]], ...] = ()
        """ServiceAccounts, Roles, RoleBindings, Deployments, PodDisruptionBudgets: the agents'
        identity and a serving PDPair's router."""

    def owner(self, key: Key) -> Owner | None:
        return next(iter(self.owners.get(key, ())), None)

    def observed(self, key: Key) -> Observed:
        children = (*self.services.get(key, ()), *self.configmaps.get(key, ()),
                    *self.claim_templates.get(key, ()), *self.secrets.get(key, ()),
                    *self.network_policies.get(key, ()),
                    *(view for index in self.extra for view in index.get(key, ())))
        return Observed(pods=tuple(self.pods.get(key, ())), children=tuple(children))


class Reconciler:
    def __init__(self, executor: Executor, metrics: OperatorMetrics, *, debounce: float = 0.05,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 scraper: dict[str, Any] | None = None, agent_role: str = DEFAULT_AGENT_CLUSTER_ROLE) -> None:
        self.indices = Indices()
        self.agent_role = agent_role
        """The ClusterRole the agents' ServiceAccounts are bound to."""
        self.scraper = scraper
        """The NetworkPolicyPeer admitted to the agents' metrics port (None: the planner's default)."""
        self.executor = executor
        self.metrics = metrics
        self.debounce = debounce
        self.clock = clock
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._dirty: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._written: dict[Key, tuple[str, dict[str, Any]]] = {}
        """Last status this operator wrote: fresher than the index until the watch catches up."""
        self._failures: dict[Key, int] = {}

    def kick(self, key: Key, delay: float | None = None) -> None:
        if delay is not None and delay > 0:
            self._schedule(key, delay)
            return
        if key in self._running:
            self._dirty.add(key)
            return
        self._running[key] = asyncio.get_running_loop().create_task(self._loop(key))

    def forget(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._written.pop(key, None)
        self._failures.pop(key, None)
        self.metrics.conditions.forget(key)

    def _schedule(self, key: Key, delay: float) -> None:
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        if existing is not None and existing.when() <= loop.time() + delay:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.kick(key)

    async def _loop(self, key: Key) -> None:
        try:
            for _ in range(1000):
                if self.debounce:
                    await asyncio.sleep(self.debounce)
                self._dirty.discard(key)
                await self.reconcile_once(key)
                if key not in self._dirty:
                    break
        finally:
            self._running.pop(key, None)

    async def reconcile_once(self, key: Key) -> None:
        started = time.perf_counter()
        result = "ok"
        try:
            result = await self._reconcile(key)
        except Exception:
            result = "error"
            log.exception("reconcile %s/%s failed", *key)
            self._retry(key)
        finally:
            self.metrics.reconciles.labels(result).inc()
            self.metrics.duration.observe(time.perf_counter() - started)

    async def _reconcile(self, key: Key) -> str:
        owner = self.indices.owner(key)
        if owner is None:
            self.forget(key)
            return "gone"
        written = self._written.get(key)
        if written is not None and written[0] == owner.uid:
            owner = msgspec.structs.replace(owner, status=written[1])
        now = self.clock()
        step = plan(owner, self.indices.observed(key), now, scraper=self.scraper,
                    agent_role=self.agent_role)
        for action, count in (("create", len(step.creates)), ("delete", len(step.deletes)),
                              ("patch", len(step.patches))):
            if count:
                self.metrics.api_requests.labels(action).inc(count)
        errors = await self.executor.apply(owner, step, rfc3339(now))
        if step.status is not None and not any(e.step == "status" for e in errors):
            self._written[key] = (owner.uid, step.status)
            self.metrics.conditions.update(key, step.status.get("conditions", []))
        if errors:
            for err in errors:
                self.metrics.errors.labels(err.step).inc()
                log.warning("%s/%s: %s %s failed: %s", key[0], key[1], err.step, err.target, err.message)
            self._retry(key)
            return "error"
        self._failures.pop(key, None)
        if step.requeue_after is not None:
            self.kick(key, step.requeue_after + 0.5)
        return "ok"

    def _retry(self, key: Key) -> None:
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        self.kick(key, min(0.5 * 2 ** (count - 1), ERROR_BACKOFF_CAP_SECONDS))


__all__ = ["Indices", "Key", "Reconciler", "SpecError"]
