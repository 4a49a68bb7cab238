"""Health, readiness and status of one agent: what ``/healthz``, ``/readyz`` and ``/status`` serve.

- live (``/healthz``): the agent's worker threads are running;
- ready (``/readyz``): at least one peer is currently paired (a successful handshake, not yet lost);
- status (``/status``): peers with their state and reason, ``refusals``: the count of peer-authentication
  refusals by reason and the ``recent`` handshake refusals (both sides record them with the precise
  reason), rooms and per-component statistics.

A caller that did not prove the pairing key (``Request.authenticated``) gets ``public_status``: the
same figures without a peer's address, label, agent id or instance.

Readiness transitions and refusals are forwarded to an optional pod-condition reporter (only when the
agent runs in a pod), so the operator sees ``pdpair.io/TransferReady`` with the same reason; the
authentication refusals go to a second one, ``pdpair.io/PeerRefusals`` (at most once per
``REFUSAL_REPORT_EVERY`` seconds: a flood of forgeries must not become a flood of API calls).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from .http import Handler, Reply, Request

log = logging.getLogger(__name__)

MAX_REFUSALS = 32
REFUSAL_REPORT_EVERY = 5.0
PEER_REFUSALS_CONDITION = "pdpair.io/PeerRefusals"
AUTH_REASONS = ("unauthenticated", "bad_mac", "replay", "foreign_pdpair")
_PRIVATE = ("agent", "instance", "bootstrap_error")
"""Top-level ``/status`` fields only key holders see (ids to aim at, error text naming addresses)."""


def _counts(value: Any) -> Any:
    """The numbers of a nested dict (counts by reason, say), without its strings."""
    if isinstance(value, dict):
        return {k: _counts(v) for k, v in value.items() if isinstance(v, int | float | dict)}
    return value


def public_status(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` as a stranger may see it: peers and prefill ranks (and pods) only as counts,
    refusals as counts, lanes and staging peers as counts, failed rooms without their peer and reason;
    no address, label or id."""
    out = {k: v for k, v in snapshot.items() if k not in _PRIVATE}
    out["peers"] = dict(Counter(p.get("state", "") for p in snapshot.get("peers", {}).values()))
    refusals = snapshot.get("refusals")
    if isinstance(refusals, list):
        out["refusals"] = dict(Counter(r.get("refused_by", "") for r in refusals))
    elif refusals is not None:
        out["refusals"] = _counts(refusals)
    rooms = snapshot.get("rooms")
    if isinstance(rooms, dict) and "recent_failures" in rooms:
        failed = [{"room": f.get("room"), "after_seconds": f.get("after_seconds")}
                  for f in rooms["recent_failures"]]
        out["rooms"] = {**rooms, "recent_failures": failed}
    if "prefill" in snapshot:
        out["prefill"] = dict(Counter(p.get("state", "") for p in snapshot["prefill"].values()))
    if "prefill_pods" in snapshot:
        pods = snapshot["prefill_pods"].values()
        out["prefill_pods"] = {"named": len(pods), "ready": sum(bool(p.get("ready")) for p in pods)}
    if "lanes" in snapshot:
        lanes = snapshot["lanes"]
        out["lanes"] = {"up": len(lanes.get("up", ())), "fallbacks": lanes.get("fallbacks", 0)}
    if "staged" in snapshot:
        out["staged"] = {k: (len(v) if isinstance(v, list) else v) for k, v in snapshot["staged"].items()}
    return out


class ConditionReporter(Protocol):
    """What ``dataplane.podstatus.PodStatusReporter`` offers; None outside a pod."""

    def report(self, ready: bool, reason: str, message: str) -> Any: ...


class AgentStatus:
    """Thread-safe record of peers and refusals; ``snapshot`` is what ``/status`` returns."""

    def __init__(
        self, role: str, agent: str, instance: str, reporter: ConditionReporter | None = None,
        refusal_reporter: ConditionReporter | None = None,
    ):
        self.role, self.agent, self.instance = role, agent, instance
        self.reporter = reporter
        self.refusal_reporter = refusal_reporter
        self._auth_counts = dict.fromkeys(AUTH_REASONS, 0)
        self._auth_reported = 0.0
        self._auth_dirty = False
        self.started = time.time()
        self._lock = threading.Lock()
        self._peers: dict[str, dict[str, Any]] = {}
        self._refusals: deque[dict[str, Any]] = deque(maxlen=MAX_REFUSALS)
        self._ready = False
        self._live: Callable[[], bool] = lambda: True
        self._extra: Callable[[], dict[str, Any]] = dict
        if refusal_reporter is not None:
            self._report_refusals()  # "False"/None from the start: the operator sees the agent checks peers
            self._auth_reported = 0.0  # the first refusal is reported at once

    def set_probes(self, live: Callable[[], bool], extra: Callable[[], dict[str, Any]]) -> None:
        self._live, self._extra = live, extra

    def peer_paired(self, peer: str, instance: str = "") -> None:
        self._set_peer(peer, "paired", "", instance)

    def peer_refused(self, peer: str, reason: str, *, by: str) -> None:
        """``by``: which side refused (``self`` or ``peer``); the reason is kept verbatim."""
        with self._lock:
            self._refusals.append({"peer": peer, "reason": reason, "refused_by": by, "at": time.time()})
        self._set_peer(peer, "refused", reason, "")

    def auth_refused(self, reason: str, counts: dict[str, int]) -> None:
        """The refusal counts by reason changed (``peerauth``); the pod condition follows, throttled."""
        with self._lock:
            self._auth_counts = dict(counts)
            self._auth_dirty = True
        self.flush_refusals()

    def flush_refusals(self) -> None:
        """Report changed refusal counts if the last report is old enough (the worker's tick calls it)."""
        if self.refusal_reporter is None or not self._auth_dirty:
            return
        if time.monotonic() - self._auth_reported < REFUSAL_REPORT_EVERY:
            return
        self._report_refusals()

    def _report_refusals(self) -> None:
        with self._lock:
            counts, self._auth_dirty = dict(self._auth_counts), False
        self._auth_reported = time.monotonic()
        if self.refusal_reporter is None:
            return
        top = max(AUTH_REASONS, key=lambda r: counts[r])
        why = "".join(w.capitalize() for w in top.split("_")) if counts[top] else "None"
        message = " ".join(f"{r}={counts[r]}" for r in AUTH_REASONS)
        try:
            self.refusal_reporter.report(counts[top] > 0, why, message)
        except Exception:
            log.exception("reporting the peer-refusals pod condition failed")

    def peer_down(self, peer: str, reason: str) -> None:
        self._set_peer(peer, "down", reason, "")

    def _set_peer(self, peer: str, state: str, reason: str, instance: str) -> None:
        with self._lock:
            prev = self._peers.get(peer, {})
            self._peers[peer] = {
                "state": state,
                "reason": reason,
                "instance": instance or prev.get("instance", ""),
                "since": time.time() if prev.get("state") != state else prev["since"],
            }
            ready = any(p["state"] == "paired" for p in self._peers.values())
            changed, self._ready = ready != self._ready, ready
        if changed or state == "refused":
            self._report(ready, state, peer, reason)

    def _report(self, ready: bool, state: str, peer: str, reason: str) -> None:
        if self.reporter is None:
            return
        if ready:
            why, message = "Paired", f"{self.role} paired with {peer}"
        elif state == "refused":
            why, message = "HandshakeRefused", f"{peer}: {reason}"
        else:
            why, message = (
                "NoPeer",
                f"{peer} {state}: {reason}" if reason else f"no paired peer ({peer} {state})",
            )
        try:
            self.reporter.report(ready, why, message)
        except Exception:
            log.exception("reporting pod condition failed")

    @property
    def ready(self) -> bool:
        return self._ready

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            peers = {k: dict(v) for k, v in self._peers.items()}
            refusals: dict[str, Any] = dict(self._auth_counts)
            refusals["recent"] = list(self._refusals)
        out = {
            "role": self.role,
            "agent": self.agent,
            "instance": self.instance,
            "ready": self._ready,
            "uptime_seconds": round(time.time() - self.started, 3),
            "peers": peers,
            "refusals": refusals,
        }
        out.update(self._extra())
        return out

    def routes(self, metrics: Callable[[], bytes], content_type: str) -> dict[tuple[str, str], Handler]:
        def healthz(_: Request) -> Reply:
            ok = self._live()
            return Reply.json({"live": ok}, 200 if ok else 503)

        def readyz(_: Request) -> Reply:
            if self._ready:
                return Reply.json({"ready": True})
            with self._lock:
                why = [f"{p}: {v['state']} {v['reason']}".strip() for p, v in self._peers.items()]
            return Reply.json({"ready": False, "reason": "; ".join(why) or "no handshake yet"}, 503)

        return {
            ("GET", "/healthz"): healthz,
            ("GET", "/readyz"): readyz,
            ("GET", "/status"): lambda req: Reply.json(
                self.snapshot() if req.authenticated else public_status(self.snapshot())
            ),
            ("GET", "/metrics"): lambda _: Reply(200, metrics(), content_type),
        }
