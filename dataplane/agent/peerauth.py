"""Who a message comes from: this agent's authenticated pairings, the seal on every message sent to a
paired peer, the check of every sealed message received, and the refusals counted by reason.

A pairing (``Pairing``) is made by the registration handshake (``codec.auth``): decode proves the
PDPair key in its registration, prefill answers ``Hello`` (or ``Refused``) sealed with the key both
derive for the pairing. From then on every message either way carries the pairing's seal, and a
message is only acted on when its seal belongs to the pairing of the peer it names (``admit``).
Unsealed messages are only taken from plain sglang peers, and only when ``auth.allowPlainPeers``.
Nothing refused is answered; each refusal is counted (metrics, ``/status``, the pod condition) and
logged at most once per ``LOG_EVERY`` seconds per reason.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..codec import Hello, Refused, decode_control
from ..codec.auth import (
    REASONS,
    AuthFailure,
    ReplayWindow,
    pairing_key,
    seal,
    seal_holds,
    seal_parts,
)
from ..codec.auth import is_sealed as _is_sealed

log = logging.getLogger(__name__)

LOG_EVERY = 10.0
"""Seconds between two log lines for refusals of one reason (the rest are counted)."""
MAX_NONCES = 4096
"""Registration nonces prefill remembers (a proof older than its window is refused anyway)."""


@dataclass(eq=False)
class Pairing:
    """One authenticated pairing: the peer's control address, the derived key, both directions'
    sequence numbers."""

    pid: bytes
    address: str
    key: bytes
    nonce: bytes = b""
    """Prefill's nonce (decode learns it from ``Hello``/``Refused``)."""
    seq: int = 0
    window: ReplayWindow = field(default_factory=ReplayWindow)
    fresh: bool = False
    """Made from a pending registration by the message being opened (decode's first ``Hello``)."""


@dataclass(eq=False)
class Pending:
    """A registration decode sent and awaits an answer to (its pair id is the nonce's head)."""

    nonce: bytes
    me: str
    instance: str
    address: str


class PeerAuth:
    def __init__(self, key: bytes | None, allow_plain: bool, metrics: Any, status: Any):
        self.key, self.allow_plain = key, allow_plain
        self.metrics, self.status = metrics, status
        self.by_id: dict[bytes, Pairing] = {}
        self.by_address: dict[str, Pairing] = {}
        self.pending: dict[bytes, Pending] = {}
        self.counts = dict.fromkeys(REASONS, 0)
        self._logged = dict.fromkeys(REASONS, 0.0)
        self._nonces: OrderedDict[bytes, None] = OrderedDict()

    # ---- pairings ----------------------------------------------------------------------------------
    def add(self, p: Pairing) -> None:
        """``p`` is the pairing with its address from now on (an older one for the address is gone)."""
        self.remove(p.address)
        p.fresh = False
        self.by_id[p.pid] = p
        self.by_address[p.address] = p
        self.pending.pop(p.pid, None)

    def remove(self, address: str) -> None:
        old = self.by_address.pop(address, None)
        if old is not None:
            self.by_id.pop(old.pid, None)

    def fresh_nonce(self, nonce: bytes) -> bool:
        """True the first time ``nonce`` is seen (prefill: each registration's nonce counts once)."""
        if nonce in self._nonces:
            return False
        self._nonces[nonce] = None
        while len(self._nonces) > MAX_NONCES:
            self._nonces.popitem(last=False)
        return True

    # ---- messages ------------------------------------------------------------------------------------
    def seal(self, address: str, frames: list[bytes]) -> list[bytes]:
        """``frames`` with the seal of ``address``'s pairing (as they are without one, or sealed already)."""
        p = self.by_address.get(address)
        if p is None or _is_sealed(frames):
            return frames
        p.seq += 1
        return [*frames, seal(p.key, p.pid, p.seq, frames)]

    def open(self, frames: list[bytes]) -> Pairing:
        """The pairing whose valid, first-seen seal ends ``frames``; ``AuthFailure`` otherwise."""
        pid, seq = seal_parts(frames[-1])
        p = self.by_id.get(pid)
        if p is None:
            p = self._from_pending(pid, frames)
        if not seal_holds(p.key, frames):
            raise AuthFailure("bad_mac", f"seal does not match the message (pairing with {p.address})")
        if not p.window.accept(seq):
            raise AuthFailure("replay", f"message {seq} of the pairing with {p.address} seen before")
        return p

    def _from_pending(self, pid: bytes, frames: list[bytes]) -> Pairing:
        pend = self.pending.get(pid)
        if pend is None or self.key is None:
            raise AuthFailure("unauthenticated", "sealed by a pairing this agent does not have")
        msg = decode_control(frames[0]) if len(frames) == 2 else None
        if not isinstance(msg, Hello | Refused) or len(msg.nonce) != len(pend.nonce):
            raise AuthFailure("unauthenticated", "a registration can only be answered by Hello or Refused")
        key = pairing_key(self.key, pend.nonce, msg.nonce, pend.me, pend.instance)
        return Pairing(pid, pend.address, key, msg.nonce, fresh=True)

    def admit(self, sender: Pairing | None, expected: Pairing | None, known: bool, what: str) -> bool:
        """Whether to act on ``what`` that names a peer (``known``: we have one by that name, paired by
        ``expected``, None for a plain peer), received sealed by ``sender`` (None: unsealed)."""
        if not known:
            self.refused("unauthenticated", f"{what}: names no peer of ours")
        elif sender is not None:
            if sender is expected:
                return True
            self.refused("bad_mac", f"{what}: sealed by the pairing with {sender.address}, not its own")
        elif expected is None and self.allow_plain:
            return True
        else:
            self.refused("unauthenticated", f"{what}: not sealed by the peer's pairing")
        return False

    # ---- refusals ------------------------------------------------------------------------------------
    def refused(self, reason: str, detail: str) -> None:
        self.counts[reason] += 1
        self.metrics.record_peer_refusal(reason)
        self.status.auth_refused(reason, self.counts)
        now = time.monotonic()
        if now - self._logged[reason] >= LOG_EVERY:
            self._logged[reason] = now
            log.warning("refused (%s, %d so far): %s", reason, self.counts[reason], detail)


__all__ = ["Pairing", "PeerAuth", "Pending"]
