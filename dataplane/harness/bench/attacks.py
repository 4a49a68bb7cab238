"""Attacks on a running prefill/decode pair, each a function in one registry (``ATTACKS``), run by
``pdpair-agent bench attacks`` (the table in docs/security.md) and by the tests
(tests/integration/test_security_peers.py: pairing; test_attacks.py: the rest).

``Pair`` is a real pair of ``pdpair-agent run`` processes on loopback that share a pairing key and
serve verified rooms without pause. An attack acts as a stranger on the pod network would — it has
the addresses, not the key — and returns a ``Finding``: what happened, the bound that held and the
figures behind it. ``passed`` also requires that the pair kept serving: more rooms succeeded after
the attack, none failed, every byte verified and decode still paired with the real prefill.

To add an attack, decorate a function ``(pair) -> Finding`` with ``@attack("name")`` here (or in a
module imported here); the command and the test pick it up.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import zmq

from ...agent.control_sockets import STRANGER_SOCKETS
from ...agent.http import get_json
from ...agent.httpauth import HEADER, sign
from ...codec import GUARD, Refused, Registration, TransferMetadata, encode_control, encode_metadata
from ...codec.auth import SEAL_MAGIC, key_id, new_nonce, prove_registration
from ...codec.registration import encode_registration
from ...config import AgentConfig, AuthConfig, ModelConfig, SyntheticConfig, TransferConfig
from ..agent_processes import AgentProcess, loopback_pair

FD_SLACK = 16
"""Descriptors a busy agent opens and closes on its own (HTTP clients, UCX wire-up) besides an attack's."""
RSS_SLACK = 48 << 20
"""RSS an agent may add under an attack besides the messages it must hold (allocator arenas, ZMQ's
buffers)."""


@dataclass
class Finding:
    attack: str
    outcome: str
    bound: str
    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)


Attack = Callable[["Pair"], Finding]
ATTACKS: dict[str, Attack] = {}


def attack(name: str) -> Callable[[Attack], Attack]:
    def register(fn: Attack) -> Attack:
        ATTACKS[name] = fn
        return fn

    return register


def pair_config() -> AgentConfig:
    """A small qwen3-next pair serving rooms without end (decode verifies every byte)."""
    return AgentConfig(
        model=ModelConfig(profile="qwen3-next", pool_pages=128, max_requests=8),
        transfer=TransferConfig(timeout_seconds=5, heartbeat_interval_seconds=0.5, heartbeat_misses=6),
        synthetic=SyntheticConfig(requests_per_second=20, requests=0, tokens=(700, 64), max_inflight=2),
    )


class Pair:
    """A prefill and a decode agent process on 127.0.0.1 sharing a pairing key in ``workdir``."""

    def __init__(self, workdir: Path, base: AgentConfig | None = None):
        key = workdir / "pairing.key"
        key.write_bytes(os.urandom(32))
        key.chmod(0o400)
        self.key = key.read_bytes()
        self.workdir = workdir
        self.base = msgspec.structs.replace(base or pair_config(), auth=AuthConfig(key_file=str(key)))
        (p_cfg,), (d_cfg,) = loopback_pair(self.base)
        self.prefill = AgentProcess(p_cfg, workdir, "prefill")
        self.decode = AgentProcess(d_cfg, workdir, "decode")
        self.ctx = zmq.Context()

    def start(self, timeout: float = 90.0) -> Pair:
        self.prefill.wait_ready(timeout)
        self.decode.wait_ready(timeout)
        self.wait_served(1, timeout)
        return self

    def stop(self) -> None:
        self.ctx.destroy(linger=0)
        self.decode.stop()
        self.prefill.stop()

    # ---- what the pair does -----------------------------------------------------------------
    def served(self) -> dict[str, int]:
        """Decode's room counts: succeeded, failed (made and finished without success), mismatches."""
        req = self.decode.status()["requests"]
        return {
            "succeeded": int(req["succeeded"]),
            "failed": int(req["completed"]) - int(req["succeeded"]),
            "verification_failures": int(req["verification_failures"]),
        }

    def wait_served(self, more: int, timeout: float = 60.0, since: dict[str, int] | None = None) -> bool:
        """Wait until ``more`` rooms succeeded beyond ``since``; whether they did in ``timeout``."""
        base = since["succeeded"] if since is not None else 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if self.served()["succeeded"] >= base + more:
                    return True
            time.sleep(0.2)
        return False

    def kept_serving(self, before: dict[str, int], more: int = 10) -> tuple[bool, dict[str, Any]]:
        """More rooms succeeded after the attack, none failed since ``before``, every byte verified,
        decode still paired with the real prefill."""
        grew = self.wait_served(more, since=before)
        after: dict[str, Any] = dict(self.served())
        status = self.decode.status()
        after["paired"] = status["prefill"]["0"]["state"] == "paired"
        after["unverified_components"] = sorted(
            name for name, c in status["components"].items()
            if c["verified_bytes"] != c["bytes"] or c["mismatched_bytes"] != 0
        )
        ok = (grew and after["failed"] == before["failed"] and after["verification_failures"] == 0
              and after["paired"] and not after["unverified_components"])
        return ok, after

    def refusals(self, agent: AgentProcess) -> dict[str, int]:
        """``agent``'s refused peer messages by reason (``/status`` ``refusals``)."""
        return {k: int(v) for k, v in agent.status()["refusals"].items() if k != "recent"}

    def live(self, agent: AgentProcess) -> bool:
        try:
            return bool(get_json(agent.url + "/healthz", timeout=2)["live"])
        except (OSError, ValueError):
            return False

    # ---- the prefill process, as /proc shows it -----------------------------------------------
    def fds(self, agent: AgentProcess) -> int:
        return len(os.listdir(f"/proc/{agent.proc.pid}/fd"))

    def rss(self, agent: AgentProcess) -> int:
        for line in Path(f"/proc/{agent.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def control(self, agent: AgentProcess) -> dict[str, Any]:
        return dict(agent.status()["control"])

    def push(self, agent: AgentProcess) -> zmq.Socket:
        """A stranger's PUSH socket to ``agent``'s control port."""
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.connect(f"tcp://127.0.0.1:{agent.ports['control_port']}")
        return sock

    def listeners(self, agent: AgentProcess) -> list[str]:
        """``host:port`` of every TCP socket of ``agent`` in the LISTEN state (IPv4 and IPv6)."""
        pid = agent.proc.pid
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        out = []
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    cols = line.split()
                    if cols[3] == "0A" and cols[9] in inodes:
                        out.append(_address(cols[1]))
        return sorted(out)


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw[::-1])}:{int(port, 16)}"
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return f"[{socket.inet_ntop(socket.AF_INET6, words)}]:{int(port, 16)}"


def _processed(status: dict[str, Any]) -> int:
    """Messages the worker has dealt with that a stranger can cause: dropped as unusable, refused
    (the ``refusals`` counts by reason, where the agent keeps them), or answered through a socket to
    a non-peer (opened and later evicted)."""
    control = status["control"]
    refusals = status.get("refusals")
    refused = sum(v for v in refusals.values() if isinstance(v, int)) if isinstance(refusals, dict) else 0
    return (int(control["evicted_sockets"]) + int(control["open_sockets"]) + sum(control["rejected"].values())
            + refused)


def _wait(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if pred():
                return True
        time.sleep(0.1)
    return False


# ---- peers: a stranger without the pairing key ----------------------------------------------------
REASONS = ("unauthenticated", "bad_mac", "replay", "foreign_pdpair")
"""Why an agent refuses a peer's message (``/status`` ``refusals``)."""
QUIET = 1.0
"""How long a stranger listens for an answer that must not come."""


class Stranger:
    """A PUSH socket aimed at an agent's control port and a PULL socket bound on loopback, whose port
    is the stranger's own return address."""

    def __init__(self, pair: Pair, agent: AgentProcess):
        self.push, self.pull = pair.ctx.socket(zmq.PUSH), pair.ctx.socket(zmq.PULL)
        for sock in (self.push, self.pull):
            sock.setsockopt(zmq.LINGER, 0)
        self.port = self.pull.bind_to_random_port("tcp://127.0.0.1")
        self.push.connect(f"tcp://127.0.0.1:{agent.ports['control_port']}")

    def send(self, frames: list[bytes]) -> None:
        self.push.send_multipart(frames)

    def heard(self, seconds: float = QUIET) -> list[list[bytes]]:
        """Every message that reached the stranger's address within ``seconds``."""
        out: list[list[bytes]] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and len(out) < 1000:
            if self.pull.poll(int(left * 1000) + 1):
                out.append(self.pull.recv_multipart())
        return out

    def close(self) -> None:
        self.push.close(linger=0)
        self.pull.close(linger=0)


@contextlib.contextmanager
def stranger(pair: Pair, agent: AgentProcess) -> Iterator[Stranger]:
    s = Stranger(pair, agent)
    try:
        yield s
    finally:
        s.close()


def registration(port: int) -> list[bytes]:
    """A plain registration (sglang's frames, no proof) naming ``127.0.0.1:port`` as the decode."""
    reg = Registration(
        endpoint="127.0.0.1", dst_port=port, engine_desc=msgspec.msgpack.encode(["stranger"]),
        dst_kv_mem_descs=(b"\x00" * 16,), dst_kv_item_len=4096,
    )
    return encode_registration(reg)


def forged_seal() -> bytes:
    """A seal frame of the right shape (magic, nonce, counter, MAC) made without the key."""
    return SEAL_MAGIC + new_nonce()[:8] + bytes(8) + bytes(16)


def _grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {r: after[r] - before[r] for r in REASONS}


def _wait_refused(pair: Pair, agent: AgentProcess, before: dict[str, int], want: dict[str, int]) -> bool:
    """Whether ``agent`` refused at least ``want[reason]`` more messages than ``before`` within 60 s."""
    return _wait(lambda: all(_grew(before, pair.refusals(agent))[r] >= n for r, n in want.items()), 60.0)


def _outcome(refused: dict[str, int], answers: int, serving: bool) -> str:
    counted = ", ".join(f"{n} {r}" for r, n in refused.items() if n) or "none"
    return f"refused and counted: {counted}; answers to the stranger: {answers}; pair kept serving: {serving}"


KEPT = "the real pair pairs and serves on, every room verified"


def _third_decode(pair: Pair, name: str, tag: str, auth: AuthConfig, reason: str) -> Finding:
    """A third decode agent, configured as the real one but with ``auth``, pointed at prefill's
    bootstrap port: it gets no prefill address (the public ``/topology``, or 401 for a request
    signed with another key), pairs with nothing and receives no byte. Its registration sent
    straight to prefill's control port (fixed per PDPair, so a stranger knows it) — plain without a
    key, proven with the other key — is refused for ``reason``, counted and unanswered."""
    before, rooms = pair.refusals(pair.prefill), pair.served()
    (_,), (d_cfg,) = loopback_pair(pair.base, bootstrap_port=pair.prefill.cfg.listen.bootstrap_port)
    third = AgentProcess(msgspec.structs.replace(d_cfg, auth=auth), pair.workdir, tag,
                         keyless=auth.key_file is None)
    try:
        third.wait_ready()
        _wait(lambda: third.status()["bootstrap_error"] is not None, 30.0)
        time.sleep(QUIET)  # room for an answer that must not come
        st = third.status()
    finally:
        third.stop()
    key = auth.read_key()
    with stranger(pair, pair.prefill) as s:
        body = registration(s.port)
        proof = [] if key is None else [
            prove_registration(key, body, pair.prefill.ports["instance"], time.time_ns(), new_nonce())]
        s.send([*body, *proof])
        refused = _wait_refused(pair, pair.prefill, before, {reason: 1})
        answers = len(s.heard())
    grew = _grew(before, pair.refusals(pair.prefill))
    serving, after = pair.kept_serving(rooms)
    state = str(st["prefill"].get("0", {}).get("state", "without a prefill address"))
    made, components = int(st["requests"]["made"]), len(st["components"])
    told = {k: v for k, v in st["refusals"].items() if k != "recent"}
    error = str(st["bootstrap_error"])
    return Finding(
        name,
        f"the third decode is told {error.split(': ', 1)[-1]!r}, stays {state}: {made} rooms, "
        f"{components} components received; its registration sent to the control port: "
        f"{_outcome(grew, answers, serving)}",
        f"no address, pairing or byte without the PDPair's key; {KEPT}",
        st["bootstrap_error"] is not None and "0" not in st["prefill"] and made == 0 and components == 0
        and not any(told.values()) and refused and answers == 0 and serving,
        {"refused": refused, "refusals": grew, "answers": answers, "third_state": state,
         "third_rooms_made": made, "third_components": components, "third_refusals": told,
         "third_bootstrap_error": st["bootstrap_error"], "kept_serving": serving, "served_after": after},
    )


@attack("a third decode without the key pointed at prefill's bootstrap port")
def keyless_decode(pair: Pair) -> Finding:
    return _third_decode(pair, "a third decode without the key pointed at prefill's bootstrap port",
                         "keyless", AuthConfig(), "unauthenticated")


@attack("a third decode holding another PDPair's key")
def foreign_decode(pair: Pair) -> Finding:
    other = pair.workdir / "other-pdpair.key"
    if not other.exists():
        other.write_bytes(os.urandom(32))
        other.chmod(0o400)
    return _third_decode(pair, "a third decode holding another PDPair's key", "foreign",
                         AuthConfig(key_file=str(other)), "foreign_pdpair")


@attack("registrations naming decode's address: plain, with a forged proof, proven for another instance")
def registrations(pair: Pair) -> Finding:
    """Plain registrations for the stranger's address and for decode's, one with the PDPair's public
    key tag and a MAC made without the key, one proven with the key for an earlier prefill instance."""
    name = "registrations naming decode's address: plain, with a forged proof, proven for another instance"
    before, rooms = pair.refusals(pair.prefill), pair.served()
    with stranger(pair, pair.prefill) as s:
        for target in (s.port, pair.decode.ports["control_port"]):
            s.send(registration(target))
        plain = _wait_refused(pair, pair.prefill, before, {"unauthenticated": 2})
        body = registration(s.port)
        wrong = b"not the key" * 3
        forged = prove_registration(wrong, body, pair.prefill.ports["instance"], time.time_ns(), new_nonce())
        s.send([*body, forged.replace(key_id(wrong), key_id(pair.key))])
        bad_mac = _wait_refused(pair, pair.prefill, before, {"bad_mac": 1})
        stale = prove_registration(pair.key, body, "an-old-instance", time.time_ns(), new_nonce())
        s.send([*body, stale])
        replay = _wait_refused(pair, pair.prefill, before, {"replay": 1})
        answers = len(s.heard())
    grew = _grew(before, pair.refusals(pair.prefill))
    serving, after = pair.kept_serving(rooms)
    return Finding(
        name,
        f"{_outcome(grew, answers, serving)}; decode still paired: {after['paired']}",
        f"a registration without a valid, fresh proof gets no answer and displaces nobody; {KEPT}",
        plain and bad_mac and replay and answers == 0 and serving,
        {"refused": {"unauthenticated": plain, "bad_mac": bad_mac, "replay": replay}, "refusals": grew,
         "answers": answers, "kept_serving": serving, "served_after": after},
    )


@attack("a key holder's registration captured and sent again")
def replayed_registration(pair: Pair) -> Finding:
    """The key holder's registration (its descriptors name no real memory, so prefill refuses it,
    sealed, to the address it proved), then the same frames again."""
    name = "a key holder's registration captured and sent again"
    before = pair.refusals(pair.prefill)
    with stranger(pair, pair.prefill) as s:
        body = registration(s.port)
        frames = [*body, prove_registration(pair.key, body, pair.prefill.ports["instance"], time.time_ns(),
                                            new_nonce())]
        s.send(frames)
        first = s.heard(5.0)
        sealed = len(first) == 1 and first[0][-1].startswith(SEAL_MAGIC)
        s.send(frames)
        replay = _wait_refused(pair, pair.prefill, before, {"replay": 1})
        answers = len(s.heard())
    grew = _grew(before, pair.refusals(pair.prefill))
    return Finding(
        name,
        f"the original answered once, sealed: {sealed}; the copy refused as replay: {replay} "
        f"({grew['replay']} counted), answers to it: {answers}",
        "each proof is accepted once (nonce, instance id, time)",
        sealed and replay and answers == 0,
        {"first_answers": len(first), "first_sealed": sealed, "replay_refused": replay, "refusals": grew,
         "answers": answers},
    )


@attack("TransferMetadata claiming decode's address, unsealed and with a forged seal")
def metadata_as_decode(pair: Pair) -> Finding:
    """Twenty rooms of metadata naming decode's control port and pages 0-7 of its pools, each
    unsealed and with a forged seal, and one naming the stranger's own unregistered address."""
    name = "TransferMetadata claiming decode's address, unsealed and with a forged seal"
    before, rooms = pair.refusals(pair.prefill), pair.served()
    with stranger(pair, pair.prefill) as s:
        for room in range(20):
            md = TransferMetadata(room=room, endpoint="127.0.0.1", dst_port=pair.decode.ports["control_port"],
                                  engine_key="decode", dst_kv_indices=np.arange(8, dtype=np.int32))
            frames = encode_metadata(md)
            s.send(frames)
            s.send([*frames, forged_seal()])
        md = TransferMetadata(room=99, endpoint="127.0.0.1", dst_port=s.port, engine_key="x",
                              dst_kv_indices=np.arange(4, dtype=np.int32))
        s.send(encode_metadata(md))
        refused = _wait_refused(pair, pair.prefill, before, {"unauthenticated": 41})
        answers = len(s.heard())
    grew = _grew(before, pair.refusals(pair.prefill))
    serving, after = pair.kept_serving(rooms)
    return Finding(
        name,
        f"41 messages: {_outcome(grew, answers, serving)}",
        f"no transfer for metadata not sealed with the pairing's key; {KEPT}",
        refused and answers == 0 and serving,
        {"refused": refused, "refusals": grew, "answers": answers, "kept_serving": serving,
         "served_after": after},
    )


@attack("Refused and status messages to decode in prefill's name")
def spoofed_refusals(pair: Pair) -> Finding:
    """``Refused`` with prefill's public agent id, unsealed and with a forged seal, and a room status
    reporting a failure."""
    name = "Refused and status messages to decode in prefill's name"
    before, rooms = pair.refusals(pair.decode), pair.served()
    with stranger(pair, pair.decode) as s:
        refused_msg = [encode_control(Refused(reason="go away", agent_id=pair.prefill.ports["agent"]))]
        s.send(refused_msg)
        s.send([*refused_msg, forged_seal()])
        s.send([GUARD, b"12345", b"4", b"0", b"spoofed failure"])
        refused = _wait_refused(pair, pair.decode, before, {"unauthenticated": 3})
        answers = len(s.heard())
    grew = _grew(before, pair.refusals(pair.decode))
    serving, after = pair.kept_serving(rooms)
    believed = any(r.get("reason") == "go away" for r in pair.decode.status()["refusals"]["recent"])
    return Finding(
        name,
        f"3 messages: {_outcome(grew, answers, serving)}; decode took the refusal: {believed}",
        f"peer messages count only sealed with the pairing's key; {KEPT}",
        refused and answers == 0 and serving and not believed,
        {"refused": refused, "refusals": grew, "answers": answers, "believed": believed,
         "kept_serving": serving, "served_after": after},
    )


@attack("a plain sglang decode (no key) where the PDPair allows plain peers")
def allowed_plain_peer(pair: Pair) -> Finding:
    """A pair of its own: a prefill with ``auth.allowPlainPeers`` and a decode without a key (sending
    sglang's frames alone) move six verified rooms. Without the setting such a decode is refused
    (the first attack above)."""
    name = "a plain sglang decode (no key) where the PDPair allows plain peers"
    base = pair_config()
    base = msgspec.structs.replace(
        base, synthetic=msgspec.structs.replace(base.synthetic, requests=6),
        auth=AuthConfig(allow_plain_peers=True),
    )
    (p_cfg,), (d_cfg,) = loopback_pair(base)
    with tempfile.TemporaryDirectory(prefix="pdpair-plain-") as tmp:
        prefill = AgentProcess(p_cfg, Path(tmp), "prefill")
        decode = AgentProcess(msgspec.structs.replace(d_cfg, auth=AuthConfig(allow_plain_peers=True)),
                              Path(tmp), "plain-decode", keyless=True)
        try:
            prefill.wait_ready()
            decode.wait_ready()
            _wait(lambda: int(decode.status()["requests"]["completed"]) >= 6, 60.0)
            req = decode.status()["requests"]
        finally:
            decode.stop()
            prefill.stop()
    ok, verified = int(req["succeeded"]), int(req["verification_failures"]) == 0
    return Finding(
        name,
        f"paired; {ok} of 6 rooms succeeded, every byte verified: {verified}",
        "plain peers pair only where auth.allowPlainPeers is set (refused without it: the first row)",
        ok == 6 and verified,
        {"succeeded": ok, "completed": int(req["completed"]), "verified": verified},
    )


# ---- control sockets, HTTP, listeners, the local API -------------------------------------------
@attack("metadata naming 1,100 unregistered decode ports")
def unregistered_ports(pair: Pair) -> Finding:
    before, fds0 = pair.served(), pair.fds(pair.prefill)
    start, refused0 = _processed(pair.prefill.status()), pair.refusals(pair.prefill)
    sock = pair.push(pair.prefill)
    empty = np.empty(0, dtype=np.int32)
    for i in range(1100):
        md = TransferMetadata(
            room=10_000_000 + i, endpoint="127.0.0.1", dst_port=20_000 + i, engine_key="stranger",
            dst_kv_indices=np.array([0], dtype=np.int32), dst_state_indices=(empty,),
        )
        sock.send_multipart(encode_metadata(md))
    done = _wait(lambda: _processed(pair.prefill.status()) - start >= 1100, 60.0)
    time.sleep(0.5)  # ZMQ's reaper closes evicted sockets' descriptors on its own thread
    fds1, control = pair.fds(pair.prefill), pair.control(pair.prefill)
    sock.close(linger=0)
    refused = _grew(refused0, pair.refusals(pair.prefill))["unauthenticated"]
    serving, after = pair.kept_serving(before)
    bound = fds0 + 2 * STRANGER_SOCKETS + FD_SLACK
    live = pair.live(pair.prefill)
    return Finding(
        "metadata naming 1,100 unregistered decode ports",
        f"handled all: {done} ({refused} refused as unauthenticated, counted); prefill fds {fds0} -> {fds1}, "
        f"{control['open_sockets']} sockets open, "
        f"{control['evicted_sockets']} to strangers closed; worker live: {live}",
        f"fds <= {bound} (before + 2 x {STRANGER_SOCKETS} stranger sockets + {FD_SLACK})",
        done and live and fds1 <= bound and serving,
        {"fds_before": fds0, "fds_after": fds1, "fd_bound": bound, "control": control, "live": live,
         "served_before": before, "served_after": after, "kept_serving": serving, "handled": done,
         "refused": refused},
    )


def _flood(pair: Pair, size: int, count: int) -> tuple[int, int, bool]:
    """Send ``count`` messages of ``size`` bytes (sglang-looking metadata, garbage inside) and
    sample prefill's RSS until they are dealt with (or refused); (baseline, peak RSS, all sent)."""
    rss0 = peak = pair.rss(pair.prefill)
    sock = pair.push(pair.prefill)
    body = os.urandom(size - 64)
    sent = 0
    for _ in range(count):
        sock.send_multipart([GUARD, b"1", body], copy=False)
        sent += 1
        peak = max(peak, pair.rss(pair.prefill))
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        peak = max(peak, pair.rss(pair.prefill))
        time.sleep(0.01)
    sock.close(linger=0)
    return rss0, peak, sent == count


@attack("sixteen messages at the size cap, then sixteen of 60 MB")
def big_messages(pair: Pair) -> Finding:
    before = pair.served()
    control0 = pair.control(pair.prefill)
    cap = int(control0["max_message_bytes"])
    rejected0 = sum(control0["rejected"].values())
    rss0, peak_cap, _ = _flood(pair, cap, 16)
    rejected = sum(pair.control(pair.prefill)["rejected"].values()) - rejected0
    _, peak_big, _ = _flood(pair, 60 << 20, 16)
    reached = sum(pair.control(pair.prefill)["rejected"].values()) - rejected0 - rejected
    serving, after = pair.kept_serving(before)
    bound = 16 * cap + RSS_SLACK
    growth = max(peak_cap, peak_big) - rss0
    live = pair.live(pair.prefill)
    return Finding(
        "sixteen messages at the size cap, then sixteen of 60 MB",
        f"cap {cap / 2**20:.2f} MiB; at the cap: {rejected} dropped as malformed, counted; of 60 MB: "
        f"{reached} reached the worker; prefill RSS {rss0 / 2**20:.0f} MiB, peak +{growth / 2**20:.1f} MiB",
        f"RSS growth <= 16 x cap + {RSS_SLACK >> 20} MiB = {bound / 2**20:.0f} MiB",
        live and growth <= bound and rejected == 16 and (reached == 0 or cap >= 60 << 20) and serving,
        {"cap": cap, "rss_before": rss0, "peak_at_cap": peak_cap, "peak_60mb": peak_big, "rss_bound": bound,
         "rejected_at_cap": rejected, "60mb_reached_worker": reached, "live": live, "kept_serving": serving,
         "served_after": after},
    )


@attack("10,000 malformed messages")
def log_flood(pair: Pair) -> Finding:
    before = pair.served()
    lines0 = _log_lines(pair.prefill)
    rejected0 = sum(pair.control(pair.prefill)["rejected"].values())
    sock = pair.push(pair.prefill)
    for i in range(10_000):
        sock.send_multipart([GUARD, b"x%d" % i, b"not metadata"])
    done = _wait(lambda: sum(pair.control(pair.prefill)["rejected"].values()) - rejected0 >= 10_000, 60.0)
    sock.close(linger=0)
    rejected = sum(pair.control(pair.prefill)["rejected"].values()) - rejected0
    lines = _log_lines(pair.prefill) - lines0
    serving, after = pair.kept_serving(before)
    return Finding(
        "10,000 malformed messages",
        f"{rejected} dropped and counted (pdpair_agent_rejected_messages_total), {lines} warnings logged",
        "one warning per kind per 10 s (<= 10 lines here)",
        done and rejected == 10_000 and lines <= 10 and serving,
        {"rejected": rejected, "log_lines": lines, "kept_serving": serving, "served_after": after},
    )


def _log_lines(agent: AgentProcess) -> int:
    """Warnings in the agent's log (``--log-format json``: one object per line)."""
    count = 0
    with contextlib.suppress(OSError):
        for line in agent.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                count += json.loads(line).get("level") == "warning"
    return count


def _request(url: str, method: str = "GET", body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(req, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


@attack("PUT /ranks redirecting rank 0, unsigned and badly signed")
def put_ranks(pair: Pair) -> Finding:
    url = f"http://127.0.0.1:{pair.prefill.ports['bootstrap_port']}/ranks"
    body = json.dumps({"rank": 0, "host": "127.0.0.66", "control_port": 9, "instance": "evil",
                       "agent": "evil", "generation": ""}).encode()
    unsigned = _request(url, "PUT", body)[0]
    forged = _request(url, "PUT", body, {HEADER: sign(os.urandom(32), "PUT", "/ranks", body)})[0]
    stale = _request(url, "PUT", body, {HEADER: sign(pair.key, "PUT", "/ranks", body, time.time() - 120)})[0]
    topo = get_json(url.replace("/ranks", "/topology"), key=pair.key)
    kept = all(r["host"] == "127.0.0.1" for r in topo["ranks"])
    codes = [unsigned, forged, stale]
    return Finding(
        "PUT /ranks redirecting rank 0, unsigned and badly signed",
        f"answers {codes} (unsigned, wrong key, 120 s old); rank addresses unchanged: {kept}",
        "only requests signed with the pairing key within 30 s, each once",
        codes == [401, 401, 401] and kept,
        {"codes": codes, "ranks": topo["ranks"]},
    )


@attack("/topology and /status asked by a stranger")
def address_leak(pair: Pair) -> Finding:
    secrets = {"127.0.0.1", pair.prefill.ports["instance"], pair.decode.ports["instance"]}
    secrets |= {str(a.ports["control_port"]) for a in (pair.prefill, pair.decode)}
    urls = [f"http://127.0.0.1:{pair.prefill.ports['bootstrap_port']}/topology",
            f"{pair.prefill.url}/status", f"{pair.decode.url}/status"]
    leaked = []
    for url in urls:
        code, body = _request(url)
        leaked += [f"{url.rsplit('/', 1)[1]}: {s}" for s in secrets if s in body.decode(errors="replace")]
        if code != 200:
            leaked.append(f"{url}: {code}")
    full = get_json(urls[0], key=pair.key)
    return Finding(
        "/topology and /status asked by a stranger",
        f"no address, port or instance in {len(urls)} answers" if not leaked else f"leaked {leaked}",
        "key holders only see addresses (signed GET)",
        not leaked and bool(full["ranks"]),
        {"leaked": leaked, "signed_topology_ranks": len(full["ranks"])},
    )


@attack("listening sockets of agents told listen.host 127.0.0.1")
def listeners(pair: Pair) -> Finding:
    found = {a.tag: pair.listeners(a) for a in (pair.prefill, pair.decode)}
    wide = [f"{tag} {addr}" for tag, addrs in found.items() for addr in addrs if not addr.startswith("127.")]
    return Finding(
        "listening sockets of agents told listen.host 127.0.0.1",
        f"{sum(len(v) for v in found.values())} listeners (ZMQ, lanes, HTTP, UCX), "
        + ("all on 127.0.0.1" if not wide else f"wider: {wide}"),
        "every listener on listen.host",
        not wide and all(found.values()),
        {"listeners": found},
    )


STRANGER_UID = 65534
"""``nobody``: the uid the local-API stranger runs as (acting as another uid needs root)."""


def _as_stranger(path: str, uid: int) -> str:
    """Connect to the Unix socket ``path`` from a forked child running as ``uid`` (and its gid) and
    return what the server says, as ``code: message`` (the child only makes system calls, then exits)."""
    from ...errors import PDPairError
    from ...localapi.messages import Error, decode_agent_message

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the stranger's ids, connect, report, exit
        out = b""
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(path)
                while len(out) < 65536:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
            out = out[4:]  # the frame's length header
        except OSError as exc:
            out = f"no answer: {exc.strerror or type(exc).__name__}".encode()
            out = b"\0" + out
        finally:
            os.write(write, out[:65536])
            os._exit(0)
    os.close(write)
    try:
        answer = b""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            chunk = os.read(read, 65536)
            if not chunk:
                break
            answer += chunk
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    if answer.startswith(b"\0"):
        return answer[1:].decode(errors="replace")
    try:
        msg = decode_agent_message(answer)
    except PDPairError as exc:
        return f"unreadable answer of {len(answer)} bytes: {exc}"
    return f"{msg.code}: {msg.message}" if isinstance(msg, Error) else f"answered {type(msg).__name__}"


@attack("a process of another uid first on the engine's local API socket")
def local_api_stranger(_: Pair) -> Finding:
    """A sidecar pair of its own: the stranger (uid ``nobody``, in the socket's group so the file
    mode lets it connect) reaches prefill's local API before the engine does."""
    from ..sidecar_pair import SidecarPair

    name = "a process of another uid first on the engine's local API socket"
    if os.getuid() != 0:
        return Finding(name, "not run: acting as another uid needs root", "-", False, {"ran": False})
    base = pair_config()
    base = msgspec.structs.replace(
        base, synthetic=msgspec.structs.replace(base.synthetic, requests_per_second=0, requests=12),
    ).with_engine(socket_group=STRANGER_UID)
    with tempfile.TemporaryDirectory(prefix="pdpair-localapi-") as tmp:
        Path(tmp).chmod(0o711)  # the stranger may reach the socket file, as in a shared emptyDir
        pair = SidecarPair(base, Path(tmp))
        try:
            for role in ("prefill", "decode"):
                pair.start_agent(role)
            sock = str(pair.cfg["prefill"].localapi.engine.socket_path)
            _wait(lambda: os.path.exists(sock), 60.0)
            answer = _as_stranger(sock, STRANGER_UID)
            for role in ("prefill", "decode"):
                pair.start_engine(role)
            decode = pair.engines["decode"]
            code = decode.proc.wait(120)
            counts = decode.report()["counts"]
            log = pair.agents["prefill"].log_tail(200)
            pair.agents["prefill"].wait_ready(30)
            counted = int(pair.agents["prefill"].status()["local_api"]["refused"])
        finally:
            pair.stop()
    refused = answer.startswith("forbidden: ") and f"uid {STRANGER_UID} may not use" in answer
    served = code == 0 and counts.get("verified") == 12 and counts.get("failed", 0) == 0
    logged = "refused a connection (1 so far)" in log and counted == 1
    return Finding(
        name,
        f"stranger told {answer[:70]!r}...; refusal logged and counted: {logged}; then the engine's 12 rooms "
        f"verified: {served}",
        "only allowed uids (the agent's own by default) are served; socket mode 0660 with a group, else 0600",
        refused and logged and served,
        {"ran": True, "answer": answer, "counts": counts, "engine_exit": code, "logged": logged,
         "counted": counted},
    )


# ---- running them -------------------------------------------------------------------------------
@contextlib.contextmanager
def running_pair(base: AgentConfig | None = None) -> Iterator[Pair]:
    with tempfile.TemporaryDirectory(prefix="pdpair-attacks-") as tmp:
        pair = Pair(Path(tmp), base)
        try:
            yield pair.start()
        finally:
            pair.stop()


def run_attacks(only: str | None = None) -> list[Finding]:
    """Every registered attack (or those whose name contains ``only``) against one fresh pair."""
    findings = []
    with running_pair() as pair:
        for name, fn in ATTACKS.items():
            if only is None or only in name:
                findings.append(fn(pair))
    return findings


def table(findings: list[Finding]) -> str:
    """The findings as a Markdown table: attack, outcome, bound, held."""
    rows = ["| attack | outcome | bound | held |", "|---|---|---|---|"]
    rows += [f"| {f.attack} | {f.outcome} | {f.bound} | {'yes' if f.passed else 'NO'} |" for f in findings]
    return "\n".join(rows)
