"""The agent's small HTTP server: bootstrap (``/topology``, rank registration), ``/healthz``,
``/readyz``, ``/status`` and ``/metrics``.

One stdlib ``ThreadingHTTPServer`` bound to an explicit address (never 0.0.0.0 by default). Handlers
are plain functions from the request to ``Reply`` that never block on the agent's workers: they read
snapshots. The server is bounded: at most ``MAX_CONCURRENT`` requests at once (503 beyond), bodies of
at most ``MAX_BODY`` bytes, and a socket timeout so a slow client cannot pin a thread.

With a ``Verifier`` (the agent has a pairing key), a request is ``authenticated`` only with a valid
``X-PDPair-Auth`` header (``httpauth``; an invalid one is refused with 401 and the reason); handlers
then decide what a stranger gets. Without one (no key configured) every request counts as authenticated.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import WireFormatError
from .httpauth import HEADER, REPLY_HEADER, Verifier, reply_holds, sign

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
MAX_CONCURRENT = 16
SOCKET_TIMEOUT = 5.0


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Reply:
        return cls(status, json.dumps(value, sort_keys=True).encode() + b"\n")

    @classmethod
    def text(cls, value: str, status: int = 200) -> Reply:
        return cls(status, value.encode(), "text/plain; charset=utf-8")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes
    authenticated: bool = True
    """The caller proved the pairing key (or the agent has none): it may see and change everything."""


Handler = Callable[[Request], Reply]


class AgentHttpServer:
    """Routes ``(method, path)`` to handlers; ``port`` is the bound port (0 in the config picks one)."""

    def __init__(
        self, host: str, port: int, routes: dict[tuple[str, str], Handler], name: str = "http",
        verifier: Verifier | None = None,
    ):
        self.routes = dict(routes)
        self.verifier = verifier
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"pdpair-{name}", daemon=True)
        self.host, self.port = host, int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> AgentHttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def dispatch(self, request: Request) -> Reply:
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            allowed = sorted(m for m, p in self.routes if p == request.path)
            if allowed:
                return Reply.json({"error": f"method {request.method} not allowed", "allowed": allowed}, 405)
            return Reply.json(
                {"error": f"no such path {request.path}", "paths": sorted({p for _, p in self.routes})}, 404
            )
        if not self._slots.acquire(blocking=False):
            return Reply.json({"error": "busy"}, 503)
        try:
            return handler(request)
        except Exception as exc:
            log.exception("http handler %s %s failed", request.method, request.path)
            return Reply.json({"error": f"{type(exc).__name__}: {exc}"}, 500)
        finally:
            self._slots.release()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            timeout = SOCKET_TIMEOUT
            protocol_version = "HTTP/1.1"

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY or length < 0:
                    self._send(Reply.json({"error": f"body over {MAX_BODY} bytes"}, 413))
                    return
                body = self.rfile.read(length) if length else b""
                authenticated = server.verifier is None
                header = self.headers.get(HEADER)
                if header is not None and server.verifier is not None:
                    why = server.verifier.check(method, self.path, body, header)  # path and query
                    if why:
                        self._send(Reply.json({"error": why}, 401))
                        return
                    authenticated = True
                request = Request(method, parts.path, parse_qs(parts.query), body, authenticated)
                reply = server.dispatch(request)
                verifier = server.verifier
                proof = verifier.reply(header, reply.body) if verifier is not None and header else None
                self._send(reply, proof)

            def _send(self, reply: Reply, proof: str | None = None) -> None:
                self.send_response(reply.status)
                if proof is not None:
                    self.send_header(REPLY_HEADER, proof)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        return _Handler


def _decode_body(url: str, body: bytes) -> Any:
    """A peer restarting behind its address may answer with an empty or cut body: a clear error."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise WireFormatError(f"{url} answered with a body that is not JSON ({len(body)} bytes)") from exc


def _signed(method: str, url: str, body: bytes, key: bytes | None) -> tuple[str, dict[str, str]]:
    """``url`` with a fresh ``nonce`` query parameter and the header signing it (``httpauth``): two
    identical requests in one second must still differ, as each signature is accepted once."""
    if key is None:
        return url, {}
    url = f"{url}{'&' if '?' in url else '?'}nonce={secrets.token_hex(8)}"
    parts = urlsplit(url)
    return url, {HEADER: sign(key, method, f"{parts.path}?{parts.query}", body)}


def get_json(url: str, timeout: float = 2.0, key: bytes | None = None, proven: bool = False) -> Any:
    """GET ``url`` and decode JSON (the decode side's bootstrap query; tests); ``key``: sign the
    request with the pairing key (the full ``/status`` and ``/topology``); ``proven``: with ``key``,
    take the answer only if it proves the key too (``httpauth.REPLY_HEADER``), else
    ``WireFormatError``."""
    import urllib.request

    url, headers = _signed("GET", url, b"", key)
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read(MAX_BODY * 16)
        proof = resp.headers.get(REPLY_HEADER)
        if proven and key is not None and not reply_holds(key, headers[HEADER], body, proof):
            raise WireFormatError(
                f"{url.partition('?')[0]}: the answer does not prove the PDPair's pairing key "
                f"({REPLY_HEADER} missing or wrong): not this PDPair's agent"
            )
        return _decode_body(url, body)


def put_json(url: str, value: Any, timeout: float = 2.0, key: bytes | None = None) -> Any:
    import urllib.request

    body = json.dumps(value).encode()
    url, signed = _signed("PUT", url, body, key)
    headers = {"Content-Type": "application/json", **signed}
    req = urllib.request.Request(url, data=body, method="PUT", headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return _decode_body(url, resp.read(MAX_BODY))
