"""The round-trip floor of a control message between two processes on this host, for the agent's
per-request overhead target: pyzmq PUSH/PULL over loopback TCP (sglang's control protocol: decode's
metadata to prefill, prefill's status back, two hops per request), a plain TCP stream read by the
receiving thread itself (what paired agents use, ``dataplane.agent.lanes``) and NIXL's standalone
notifications (``send_notif`` / ``get_new_notifs``).

Each carrier is timed both ways a receiver can wait: sleeping (ZMQ: ``poll``; TCP: ``select``; NIXL:
20 µs sleeps between checks) and spinning. Pings are 0.5 ms apart (one request at a time, as the
latency figures are taken); the first 10% are left out. Prints p50 / p90 µs per round trip.

    python3 bench/control_floor.py [--iterations 3000] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import socket
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FRAMES = [b"x" * 8] * 5
"""A status message's shape: five short frames."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _zmq_recv(sock: Any, poller: Any, spin: bool) -> None:
    import zmq

    if spin:
        while True:
            try:
                sock.recv_multipart(flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
    if not poller.poll(5000):
        raise TimeoutError("no reply within 5 s")
    sock.recv_multipart()


def _zmq_echo(port_in: int, port_out: int, spin: bool, n: int) -> None:
    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(f"tcp://127.0.0.1:{port_in}")
    push.connect(f"tcp://127.0.0.1:{port_out}")
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    for _ in range(n):
        _zmq_recv(pull, poller, spin)
        push.send_multipart(FRAMES)


def zmq_round_trips(spin: bool, n: int) -> list[float]:
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port_out = pull.bind_to_random_port("tcp://127.0.0.1")
    port_in = _free_port()
    child = mp.get_context("spawn").Process(target=_zmq_echo, args=(port_in, port_out, spin, n), daemon=True)
    child.start()
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port_in}")
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        push.send_multipart(FRAMES)
        _zmq_recv(pull, poller, spin)
        times.append(time.perf_counter() - start)
        time.sleep(0.0005)
    child.join(10)
    ctx.destroy(linger=0)
    return times


def _tcp_recv(sock: socket.socket, spin: bool) -> None:
    """One length-prefixed message (a 4-byte length, then the bytes)."""
    import select

    want, got = 4, b""
    body = False
    deadline = time.monotonic() + 5
    while True:
        if not spin and not select.select([sock], [], [], 5)[0]:
            raise TimeoutError("no reply within 5 s")
        try:
            chunk = sock.recv(want - len(got))
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply within 5 s") from None
            continue
        if not chunk:
            raise ConnectionError("peer closed")
        got += chunk
        if len(got) == want:
            if body:
                return
            want, got, body = int.from_bytes(got, "little"), b"", True


def _tcp_message() -> bytes:
    body = b"".join(len(f).to_bytes(4, "little") + f for f in FRAMES)
    return len(body).to_bytes(4, "little") + body


def _tcp_socket(sock: socket.socket, spin: bool) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(not spin)
    return sock


def _tcp_echo(port: int, spin: bool, n: int) -> None:
    sock = _tcp_socket(socket.create_connection(("127.0.0.1", port), timeout=5), spin)
    msg = _tcp_message()
    for _ in range(n):
        _tcp_recv(sock, spin)
        sock.sendall(msg)
    sock.close()


def tcp_round_trips(spin: bool, n: int) -> list[float]:
    """A plain TCP stream, each side's thread reading its own socket: no I/O threads in between."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        child = mp.get_context("spawn").Process(
            target=_tcp_echo, args=(srv.getsockname()[1], spin, n), daemon=True
        )
        child.start()
        srv.settimeout(30)
        sock = _tcp_socket(srv.accept()[0], spin)
    msg = _tcp_message()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        sock.sendall(msg)
        _tcp_recv(sock, spin)
        times.append(time.perf_counter() - start)
        time.sleep(0.0005)
    child.join(10)
    sock.close()
    return times


def _nixl_agent(name: str) -> Any:
    from dataplane.transports.nixl.sdk import load_sdk, new_agent

    sdk = load_sdk()
    logging.getLogger("nixl").setLevel(logging.WARNING)  # NIXL logs INFO lines to stdout
    conf = sdk.nixl_agent_config(enable_listen_thread=False, backends=["UCX"], num_threads=0)
    return new_agent(sdk, name, conf, 100)  # the agent's default progress-thread delay


def _nixl_wait(agent: Any, spin: bool) -> None:
    deadline = time.monotonic() + 5
    while not agent.get_new_notifs():
        if time.monotonic() > deadline:
            raise TimeoutError("no notification within 5 s")
        if not spin:
            time.sleep(20e-6)


def _nixl_echo(conn: Connection, spin: bool, n: int) -> None:
    agent = _nixl_agent("floor-b")
    conn.send(agent.get_agent_metadata())
    agent.add_remote_agent(conn.recv())
    conn.recv()
    for _ in range(n):
        _nixl_wait(agent, spin)
        agent.send_notif("floor-a", b"pong")
    conn.recv()


def nixl_round_trips(spin: bool, n: int) -> list[float]:
    here, there = mp.get_context("spawn").Pipe()
    child = mp.get_context("spawn").Process(target=_nixl_echo, args=(there, spin, n), daemon=True)
    child.start()
    agent = _nixl_agent("floor-a")
    here.send(agent.get_agent_metadata())
    agent.add_remote_agent(here.recv())
    time.sleep(0.5)
    here.send("go")
    times = []
    for _ in range(n):
        start = time.perf_counter()
        agent.send_notif("floor-b", b"ping")
        _nixl_wait(agent, spin)
        times.append(time.perf_counter() - start)
        time.sleep(0.0005)
    here.send("stop")
    child.join(10)
    return times


def summary(carrier: str, wait: str, times: list[float]) -> dict[str, Any]:
    kept = sorted(times[len(times) // 10 :])
    return {
        "carrier": carrier,
        "wait": wait,
        "round_trips": len(kept),
        "p50_us": round(statistics.median(kept) * 1e6, 1),
        "p90_us": round(kept[int(len(kept) * 0.9)] * 1e6, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for carrier, fn in (("zmq", zmq_round_trips), ("tcp", tcp_round_trips), ("nixl-notif", nixl_round_trips)):
        for spin in (False, True):
            rows.append(summary(carrier, "spin" if spin else "sleep", fn(spin, args.iterations)))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'carrier':<11} {'wait':<6} {'round trips':>11} {'p50 us':>8} {'p90 us':>8}")
        for r in rows:
            head = f"{r['carrier']:<11} {r['wait']:<6} {r['round_trips']:>11}"
            print(f"{head} {r['p50_us']:>8} {r['p90_us']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
