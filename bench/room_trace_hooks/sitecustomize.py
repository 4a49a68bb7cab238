"""Timestamps around the role workers' steps, for ``bench/room_trace.py`` (loaded only through the
``PYTHONPATH`` that script sets; ``PDPAIR_ROOM_TRACE`` names the folder the traces go to).

Instrumentation, like a profiler's: it wraps methods of the agent in the benchmark's agent processes
and never runs in a deployed agent. One clock for every process of a host (``time.perf_counter`` is
CLOCK_MONOTONIC on Linux), so prefill's and decode's marks of one room line up. Marks per room id:
decode ``D0a``/``D0b`` (around making and sending the metadata), ``D1``/``D2`` (around handling the
status); prefill ``Pw`` (its inbox's last wait returned), ``P0`` (room started), ``Qa``/``Qb`` (plan),
``Ra``/``Rb`` (engine requests), ``Wa``/``Wb`` (``write``), ``Xa``/``Xb`` (NIXL's post), ``P2``/``P3``
(around ``finish``), ``Ps`` (its status about to be handed to the lane or ZMQ), ``P4`` (a corked status left).
"""

import json
import os
import time

_OUT = os.environ.get("PDPAIR_ROOM_TRACE")

if _OUT:
    import dataplane.agent.control as _control
    import dataplane.agent.decode as _decode
    import dataplane.agent.lanes as _lanes
    import dataplane.agent.prefill as _prefill
    import dataplane.agent.roles as _roles
    import dataplane.transports.nixl as _nixl

    _now = time.perf_counter
    _marks: dict[int, dict[str, float]] = {}
    _state = {"room": None, "polled": 0.0, "unsent": []}

    def _mark(room, step, at=None):
        _marks.setdefault(room, {})[step] = _now() if at is None else at

    def _wrap(owner, name, before, after, room_of):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            room = room_of(args)
            if room is not None and before:
                _mark(room, before)
            result = original(*args, **kwargs)
            if room is not None and after:
                _mark(room, after)
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

    _start_room = _prefill.PrefillWorker.start_room

    def start_room(self, dp, md):
        _state["room"] = md.room
        _mark(md.room, "Pw", _state["polled"])
        _mark(md.room, "P0")
        _start_room(self, dp, md)

    _prefill.PrefillWorker.start_room = start_room
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

    _shutdown = _roles.RoleWorker.shutdown

    def shutdown(self):
        with open(os.path.join(_OUT, f"{self.role}.json"), "w") as f:
            json.dump({str(k): v for k, v in _marks.items()}, f)
        _shutdown(self)

    _roles.RoleWorker.shutdown = shutdown
