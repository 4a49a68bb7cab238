"""Peer authentication between the agents of one PDPair: proofs of the PDPair's shared key that never
send the key (stdlib ``hmac``/``hashlib``/``secrets`` only).

- **Registration proof**: decode appends one frame to its registration (after the manifest; plain
  sglang reads fixed positions and ignores it): ``REG_PROOF_MAGIC`` + msgpack ``[key_id, nonce,
  instance, time_ns, offer, mac]``. The MAC covers every registration frame before it, a fresh nonce,
  the prefill instance it is meant for (a registration replayed to a restarted prefill names the old
  instance), the time, and the digest of the staged-landing offer sent just before it (or empty).
  ``key_id`` (a one-way tag of the key) tells a peer of another PDPair (``foreign_pdpair``) from a
  forgery (``bad_mac``).
- **Pairing key**: ``pairing_key`` derives one key per pairing from the PDPair key, both nonces,
  decode's control address and prefill's instance, so every later message is bound to that address.
- **Sealed messages**: every later message of a pair carries one trailing frame, ``SEAL_MAGIC`` +
  pair id (8) + sequence number (8, little-endian) + MAC (16) over the pair id, the sequence number and
  the message's frames. ``ReplayWindow`` accepts each sequence number once (messages may arrive out of
  order across ZMQ and a lane, within ``REPLAY_WINDOW``).

Refusal reasons (``REASONS``) are the labels the agent counts and reports.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Sequence
from typing import Annotated

import msgspec

from ..errors import BadInput

REASONS = ("unauthenticated", "bad_mac", "replay", "foreign_pdpair")
"""Why a message or registration was refused (metric labels, ``/status`` keys)."""
REG_PROOF_MAGIC = b"PDPAIR-PROOF-1"
SEAL_MAGIC = b"PDPS"
NONCE_BYTES = 16
KEY_ID_BYTES = 8
PAIR_ID_BYTES = 8
MAC_BYTES = 16
SEAL_BYTES = len(SEAL_MAGIC) + PAIR_ID_BYTES + 8 + MAC_BYTES
REPLAY_WINDOW = 4096
"""Sequence numbers this far below the highest seen are refused as replays."""
PROOF_WINDOW_NS = 300 * 10**9
"""A registration proof older (or newer) than this is refused as a replay (pods' clocks are synced)."""
MAX_PROOF_BYTES = 512

_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1
_SEQ = struct.Struct("<Q")
_LEN = struct.Struct("<I")
_DIGEST = "sha256"


class AuthFailure(BadInput):
    """A proof or seal that does not hold; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class RegistrationProof(msgspec.Struct, frozen=True, array_like=True):
    key_id: Annotated[bytes, msgspec.Meta(max_length=KEY_ID_BYTES)]
    nonce: Annotated[bytes, msgspec.Meta(min_length=NONCE_BYTES, max_length=NONCE_BYTES)]
    instance: Annotated[str, msgspec.Meta(max_length=128)]
    time_ns: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
    offer: Annotated[bytes, msgspec.Meta(max_length=32)]
    mac: Annotated[bytes, msgspec.Meta(max_length=MAC_BYTES)]


_PROOF_DECODER = msgspec.msgpack.Decoder(RegistrationProof)
_ENCODER = msgspec.msgpack.Encoder()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def key_id(key: bytes) -> bytes:
    """A public tag of the key: equal tags, same PDPair (it reveals nothing about the key)."""
    return hmac.digest(key, b"pdpair-key-id-1", _DIGEST)[:KEY_ID_BYTES]


def frames_digest(frames: Sequence[bytes]) -> bytes:
    """SHA-256 of the frames with their lengths (no two frame lists share an input)."""
    h = hashlib.sha256()
    for f in frames:
        h.update(_LEN.pack(len(f)))
        h.update(f)
    return h.digest()


def offer_digest(frame: bytes | None) -> bytes:
    return hashlib.sha256(frame).digest() if frame else b""


def _registration_mac(key: bytes, body: Sequence[bytes], p: RegistrationProof) -> bytes:
    data = b"".join(
        (b"pdpair-registration-1\0", frames_digest(body), p.nonce, p.instance.encode(), b"\0",
         _SEQ.pack(p.time_ns), p.offer)
    )
    return hmac.digest(key, data, _DIGEST)[:MAC_BYTES]


def prove_registration(
    key: bytes, body: Sequence[bytes], instance: str, time_ns: int, nonce: bytes, offer: bytes = b""
) -> bytes:
    """The proof frame decode appends to its registration ``body`` for prefill ``instance``."""
    unsigned = RegistrationProof(key_id(key), nonce, instance, time_ns, offer, b"")
    proof = msgspec.structs.replace(unsigned, mac=_registration_mac(key, body, unsigned))
    return REG_PROOF_MAGIC + _ENCODER.encode(proof)


def is_proof_frame(frame: bytes) -> bool:
    return frame.startswith(REG_PROOF_MAGIC)


def split_proof(frames: Sequence[bytes]) -> tuple[list[bytes], bytes | None]:
    """(the registration's frames, its proof frame or None): the proof is always the last frame."""
    if len(frames) > 1 and is_proof_frame(frames[-1]):
        return list(frames[:-1]), frames[-1]
    return list(frames), None


def check_registration(
    key: bytes, body: Sequence[bytes], frame: bytes, instance: str, now_ns: int
) -> RegistrationProof:
    """The proof, if it holds for ``body`` and this prefill ``instance`` now; else ``AuthFailure``."""
    if len(frame) > MAX_PROOF_BYTES:
        raise AuthFailure("bad_mac", f"registration proof of {len(frame)} bytes")
    try:
        p = _PROOF_DECODER.decode(frame[len(REG_PROOF_MAGIC):])
    except msgspec.MsgspecError as exc:
        raise AuthFailure("bad_mac", f"malformed registration proof ({exc})") from None
    if not hmac.compare_digest(p.key_id, key_id(key)):
        raise AuthFailure("foreign_pdpair", "registration proves another PDPair's key")
    if not hmac.compare_digest(p.mac, _registration_mac(key, body, p)):
        raise AuthFailure("bad_mac", "registration proof does not match its frames")
    if p.instance != instance:
        raise AuthFailure("replay", f"registration meant for prefill instance {p.instance!r}")
    if abs(now_ns - p.time_ns) > PROOF_WINDOW_NS:
        raise AuthFailure("replay", f"registration proof {abs(now_ns - p.time_ns) / 1e9:.0f} s off the clock")
    return p


def pairing_key(
    key: bytes, decode_nonce: bytes, prefill_nonce: bytes, decode_address: str, instance: str
) -> bytes:
    """The per-pairing key: only holders of the PDPair key can derive it from the public inputs."""
    address = decode_address.encode()
    info = b"".join((b"pdpair-pairing-1\0", decode_nonce, prefill_nonce, address, b"\0", instance.encode()))
    return hmac.digest(key, info, _DIGEST)


def pair_id(decode_nonce: bytes) -> bytes:
    """Names the pairing on both sides (public: decode's nonce is on the wire)."""
    return decode_nonce[:PAIR_ID_BYTES]


def lane_token(pkey: bytes) -> bytes:
    """What decode presents when it dials prefill's lane: derived, never sent by prefill."""
    return hmac.digest(pkey, b"pdpair-lane-1", _DIGEST)[:16]


def _seal_mac(pkey: bytes, head: bytes, frames: Sequence[bytes]) -> bytes:
    parts = [head]
    for f in frames:
        parts.append(_LEN.pack(len(f)))
        parts.append(f)
    return hmac.digest(pkey, b"".join(parts), _DIGEST)[:MAC_BYTES]


def seal(pkey: bytes, pid: bytes, seq: int, frames: Sequence[bytes]) -> bytes:
    """The trailing frame that authenticates ``frames`` as message ``seq`` of pairing ``pid``."""
    head = pid + _SEQ.pack(seq)
    return SEAL_MAGIC + head + _seal_mac(pkey, head, frames)


def is_sealed(frames: Sequence[bytes]) -> bool:
    last = frames[-1] if frames else b""
    return len(last) == SEAL_BYTES and last.startswith(SEAL_MAGIC)


def seal_parts(frame: bytes) -> tuple[bytes, int]:
    """(pair id, sequence number) of a seal frame (``is_sealed`` said it is one)."""
    at = len(SEAL_MAGIC)
    return frame[at:at + PAIR_ID_BYTES], _SEQ.unpack_from(frame, at + PAIR_ID_BYTES)[0]


def seal_holds(pkey: bytes, frames: Sequence[bytes]) -> bool:
    """Whether the last frame of ``frames`` is a valid seal of the others under ``pkey``."""
    last = frames[-1]
    at = len(SEAL_MAGIC)
    head = last[at:at + PAIR_ID_BYTES + 8]
    return hmac.compare_digest(last[at + PAIR_ID_BYTES + 8:], _seal_mac(pkey, head, frames[:-1]))


class ReplayWindow:
    """Accepts each sequence number once; numbers ``REPLAY_WINDOW`` or more below the highest seen
    are refused (a bit per number in the window: bounded memory)."""

    __slots__ = ("bits", "top")

    def __init__(self) -> None:
        self.top = 0
        self.bits = 0

    def accept(self, seq: int) -> bool:
        if seq > self.top:
            shift = seq - self.top
            self.bits = ((self.bits << shift) | 1) & _WINDOW_MASK if shift < REPLAY_WINDOW else 1
            self.top = seq
            return True
        off = self.top - seq
        if off >= REPLAY_WINDOW or (self.bits >> off) & 1:
            return False
        self.bits |= 1 << off
        return True


__all__ = [
    "REASONS",
    "AuthFailure",
    "RegistrationProof",
    "ReplayWindow",
    "check_registration",
    "is_sealed",
    "key_id",
    "lane_token",
    "new_nonce",
    "offer_digest",
    "pair_id",
    "pairing_key",
    "prove_registration",
    "seal",
    "seal_holds",
    "seal_parts",
    "split_proof",
]
