"""Requests to an agent's HTTP endpoints that prove they hold the PDPair's pairing key.

A request carries ``X-PDPair-Auth: <unix seconds>:<hex HMAC-SHA256(key, METHOD \\n PATH \\n seconds
\\n hex(sha256(body)))>``, PATH being the request target as sent (the query included). The agent
accepts it within ``WINDOW`` seconds of its own clock, and each MAC once: a captured request cannot
be replayed. Signers add a random ``nonce`` query parameter (``http._signed``), so two identical
requests in one second still differ. The replay memory holds only MACs that verified (a stranger
cannot fill it) and forgets them once they are out of the window; it is bounded all the same
(``MAX_REMEMBERED``: then refuses until entries expire). The key never travels.

Used for ``PUT /ranks`` (a rank's announcement) and for the full ``/status`` and ``/topology``; without
a valid header those endpoints answer only what a stranger may know.

The answer to a signed request proves the key too: ``X-PDPair-Reply: <hex HMAC-SHA256(key, "reply" \n
request MAC \n hex(sha256(body)))>``, bound to that one request. Decode reads a prefill's ``/topology``
only with it (``reply_holds``): an address that is not the PDPair's prefill cannot hand decode control
addresses to register with.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time

HEADER = "X-PDPair-Auth"
WINDOW = 30
"""Seconds a signed request stays valid either side of the agent's clock."""
MAX_REMEMBERED = 4096
"""Most accepted MACs remembered at once (all within 2 x ``WINDOW`` seconds)."""
_MAX_HEADER = 128


def _mac(key: bytes, method: str, path: str, seconds: int, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    message = f"{method}\n{path}\n{seconds}\n{digest}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(key: bytes, method: str, path: str, body: bytes = b"", now: float | None = None) -> str:
    """The header value for a request (``now``: the signer's clock, for tests of the window)."""
    seconds = int(time.time() if now is None else now)
    return f"{seconds}:{_mac(key, method, path, seconds, body)}"


REPLY_HEADER = "X-PDPair-Reply"


def reply_mac(key: bytes, request_header: str, body: bytes) -> str:
    """The ``X-PDPair-Reply`` value answering the request signed ``request_header`` with ``body``."""
    mac = request_header.rpartition(":")[2]
    message = f"reply\n{mac}\n{hashlib.sha256(body).hexdigest()}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def reply_holds(key: bytes, request_header: str, body: bytes, reply_header: str | None) -> bool:
    return reply_header is not None and hmac.compare_digest(
        reply_header.encode(), reply_mac(key, request_header, body).encode()
    )


class Verifier:
    """Checks ``X-PDPair-Auth`` headers against one key (thread-safe: the HTTP server's threads share it)."""

    def __init__(self, key: bytes, window: int = WINDOW, max_remembered: int = MAX_REMEMBERED):
        self._key, self.window, self.max_remembered = key, window, max_remembered
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def reply(self, request_header: str, body: bytes) -> str:
        """The ``X-PDPair-Reply`` for the answer to a request this verifier accepted."""
        return reply_mac(self._key, request_header, body)

    def check(self, method: str, path: str, body: bytes, header: str, now: float | None = None) -> str:
        """'' when the header proves the key for this request, else why not (one line, for the reply)."""
        if len(header) > _MAX_HEADER or header.count(":") != 1:
            return f"{HEADER} is malformed: expected <unix seconds>:<hex hmac-sha256>"
        stamp, mac = header.split(":")
        if not stamp.isdigit() or len(stamp) > 12:
            return f"{HEADER} is malformed: the timestamp is not unix seconds"
        seconds, clock = int(stamp), time.time() if now is None else now
        if abs(clock - seconds) > self.window:
            off = clock - seconds
            return f"{HEADER} timestamp is {off:+.0f}s off this agent's clock (at most {self.window}s)"
        if not hmac.compare_digest(mac, _mac(self._key, method, path, seconds, body)):
            return f"{HEADER} does not verify: sign with the PDPair's pairing key"
        with self._lock:
            for old in [m for m, t in self._seen.items() if clock - t > 2 * self.window]:
                del self._seen[old]
            if mac in self._seen:
                return f"{HEADER} was already used: sign each request afresh"
            if len(self._seen) >= self.max_remembered:
                return f"{HEADER}: too many signed requests in {2 * self.window}s, retry later"
            self._seen[mac] = float(seconds)
        return ""
