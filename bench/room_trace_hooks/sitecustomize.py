"""Timestamps around the role workers' steps, for ``bench/room_trace.py`` (loaded only through the
``PYTHONPATH`` that script sets; ``PDPAIR_ROOM_TRACE`` names the folder the traces go to).

Instrumentation, like a profiler's: it wraps methods of the agent in the benchmark's agent processes
and never runs in a deployed agent. One clock for every process of a host (``time.perf_counter`` is
CLOCK_MONOTONIC on Linux), so prefill's and decode's marks of one room line up. Marks per room id:
decode ``D0a``/``D0b`` (around making and sending the metadata), ``D1``/``D2`` (around handling the
status); prefill ``Pw`` (its inbox's last wait returned), ``P0`` (room started), ``Qa``/``Qb`` (plan),
``Ra``/``Rb`` (engine requests), ``Wa``/``Wb`` (``write``), ``Xa``/``Xb`` (NIXL's post), ``P2``/``P3``
(around ``finish``), ``Ps`` (its status about to be handed to the lane or ZMQ), ``P4`` (a corked status left).

In sidecar mode (``--sidecar``) the engines and the local API are marked too, each name led by who made
it — ``E`` the decode engine, ``G`` the prefill engine, ``D`` / ``P`` the agents: ``s0``/``s1`` around the
engine's ``expect`` / ``send`` call, ``r<state>`` when the engine read that room state, ``c0``/``c1``
around the agent's connection thread handling the request, ``w0`` when the worker took it off the link,
``f<state>`` when the worker pushed that state to the engine. Traces go to one file per process.
(``c0``/``c1`` are made by whichever thread reads the request: the worker, once the connection is lent.)
"""

import json
import os
import time

_OUT = os.environ.get("PDPAIR_ROOM_TRACE")

if _OUT:
    import dataplane.agent.control_sockets as _control
    import dataplane.agent.decode as _decode
    import dataplane.agent.lanes as _lanes
    import dataplane.agent.prefill as _prefill
    import dataplane.agent.roles as _roles
    import dataplane.localapi.client as _client
    import dataplane.localapi.server as _server
    import dataplane.localapi.workers as _workers
    import dataplane.synthetic_engine.process as _engine
    import dataplane.transports.nixl as _nixl

    _now = time.perf_counter
    _marks: dict[int, dict[str, float]] = {}
    _state = {"room": None, "polled": 0.0, "unsent": [], "who": "", "role": "process"}

    def _mark(room, step, at=None):
        _marks.setdefault(room, {})[step] = _now() if at is None else at

    def _wrap(owner, name, before, after, room_of, lead=lambda: ""):
        """Mark ``before`` / ``after`` (led by ``lead()``, the process's letter in sidecar mode) around
        ``owner.name`` for the room ``room_of(args)`` names."""
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            room = room_of(args)
            if room is not None and before:
                _mark(room, lead() + before)
            result = original(*args, **kwargs)
            if room is not None and after:
                _mark(room, lead() + after)
            return result

        setattr(owner, name, wrapped)

    _current = lambda args: _state["room"]  # noqa: E731 - the room prefill is working on

    _new_room = _decode.DecodeWorker.new_room

    def new_room(self, tokens):
        started = _now()
        made = _new_room(self, tokens)
        if made:
            room = self._room_base + self.made - 1
            _mark(room, "D0a", started)
            _mark(room, "D0b")
        return made

    _decode.DecodeWorker.new_room = new_room

    _on_status = _decode.DecodeWorker.on_sglang

    def on_status(self, frames):
        got = _now()
        try:
            room = int(frames[1])
        except (IndexError, ValueError):
            room = None
        _on_status(self, frames)
        if room in _marks:
            _mark(room, "D1", got)
            _mark(room, "D2")

    _decode.DecodeWorker.on_sglang = on_status

    _ready = _control.Inbox._ready

    def ready(self, timeout):
        fds = _ready(self, timeout)
        _state["polled"] = _now()
        return fds

    _control.Inbox._ready = ready

    def _traced_start_room(owner):
        original = owner.start_room

        def start_room(self, dp, md):
            _state["room"] = md.room
            _mark(md.room, "Pw", _state["polled"])
            _mark(md.room, "P0")
            original(self, dp, md)

        owner.start_room = start_room

    _traced_start_room(_prefill.PrefillWorker)
    _traced_start_room(_workers.ExternalPrefillWorker)
    _wrap(_prefill, "plan_request", "Qa", "Qb", _current)
    _wrap(_prefill, "transfer_requests", "Ra", "Rb", _current)
    _wrap(_nixl.NixlTransport, "write", "Wa", "Wb", _current)
    _wrap(_nixl.NixlTransport, "_post_one", "Xa", "Xb", _current)

    _finish = _prefill.PrefillWorker.finish

    def finish(self, room, state, notify=True):
        if room is not None:
            _mark(room.room, "P2")
        _finish(self, room, state, notify)
        if room is not None:
            _mark(room.room, "P3")
            _state["unsent"].append(room.room)

    _prefill.PrefillWorker.finish = finish

    _send_status = _prefill.PrefillWorker.send_status

    def send_status(self, address, room, state, reason):
        _mark(room, "Ps")  # before the send: on loopback decode may handle it before the send returns
        _send_status(self, address, room, state, reason)

    _prefill.PrefillWorker.send_status = send_status

    _uncork = _lanes.Lanes.uncork

    def uncork(self, *args, **kwargs):
        result = _uncork(self, *args, **kwargs)
        sent = _now()
        while _state["unsent"]:
            _mark(_state["unsent"].pop(), "P4", sent)
        return result

    _lanes.Lanes.uncork = uncork

    # ---- the sidecar's local API: engines (E decode, G prefill) and the agents' side of it ----
    _who = lambda: _state["who"]  # noqa: E731 - set once per process, below

    _worker_init = _roles.RoleWorker.__init__

    def worker_init(self, *args, **kwargs):
        _state["who"], _state["role"] = self.role[0].upper(), f"{self.role}-agent"
        _worker_init(self, *args, **kwargs)

    _roles.RoleWorker.__init__ = worker_init

    _engine_init = _engine.SyntheticEngineProcess.__init__

    def engine_init(self, cfg, *args, **kwargs):
        _state["who"], _state["role"] = ("E" if cfg.role == "decode" else "G"), f"{cfg.role}-engine"
        _engine_init(self, cfg, *args, **kwargs)

    _engine.SyntheticEngineProcess.__init__ = engine_init

    _wrap(_client.AgentClient, "expect", "s0", "s1", lambda a: a[1], _who)
    _wrap(_client.AgentClient, "send", "s0", "s1", lambda a: a[1], _who)
    _request = lambda a: getattr(a[1], "room", None) if type(a[1]).__name__ in ("Send", "Expect") else None  # noqa: E731
    _wrap(_server.Session, "handle", "c0", "c1", _request, _who)

    def _picked(args):
        room = getattr(args[1], "room", None)
        if room is not None:
            _state["room"] = room
        return room

    _wrap(_workers.ExternalPrefillWorker, "on_command", "w0", "", _picked, _who)
    _wrap(_workers.ExternalDecodeWorker, "on_command", "w0", "", _picked, _who)

    _start_expect = _workers.ExternalDecodeWorker.start_expect

    def start_expect(self, cmd):
        _mark(cmd.room, "D0a")
        _start_expect(self, cmd)
        _mark(cmd.room, "D0b")

    _workers.ExternalDecodeWorker.start_expect = start_expect

    def _first(room, step):
        _marks.setdefault(room, {}).setdefault(step, _now())

    _push = _server._Connection.__call__

    def push(self, states):
        for st in states:
            _first(st.room, f"{_who()}f{st.state}")
        _push(self, states)

    _server._Connection.__call__ = push

    _apply = _client.AgentClient._apply

    def apply(self, msg):
        room, state = getattr(msg, "room", -1), getattr(msg, "state", None)
        if room >= 0 and state is not None:
            _first(room, f"{_who()}r{state}")
        _apply(self, msg)

    _client.AgentClient._apply = apply

    def _dump():
        path = os.path.join(_OUT, f"{_state['role']}-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"who": _state["who"], "marks": {str(k): v for k, v in _marks.items()}}, f)

    _shutdown = _roles.RoleWorker.shutdown

    def shutdown(self):
        _dump()
        _shutdown(self)

    _roles.RoleWorker.shutdown = shutdown

    _close = _engine.SyntheticEngineProcess.close

    def close(self):
        _dump()
        _close(self)

    _engine.SyntheticEngineProcess.close = close
