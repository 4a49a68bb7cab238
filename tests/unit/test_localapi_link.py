"""The link's pushes and when the role workers make them: a state the engine acts on at once (then
the worker polls for the engine's answer instead of sleeping, ``localapi.engine.replySpinMicroseconds``),
one it only shows within ``SHOW_WITHIN`` — usually overtaken by the room's Success."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from dataplane.codec import KVPoll
from dataplane.config import AgentConfig
from dataplane.localapi.link import EngineLink
from dataplane.localapi.sources import SHOW_WITHIN, EngineSide


def worker(reply_spin_us: int) -> SimpleNamespace:
    """The parts of a role worker ``EngineSide`` touches."""
    cfg = AgentConfig().with_engine(reply_spin_microseconds=reply_spin_us)
    inbox = SimpleNamespace(waker=lambda: lambda: None)
    return SimpleNamespace(
        cfg=cfg, inbox=inbox, owns_items=True, on_shutdown=[], spin_until=0.0, role="prefill", tracing=False
    )


def test_flush_pushes_the_latest_state_per_room_once_and_says_what_it_pushed():
    pushed = []
    link = EngineLink(pushed.append)
    link.report(1, KVPoll.Bootstrapping)
    link.report(2, KVPoll.WaitingForInput)
    link.report(2, KVPoll.Transferring)
    link.report(3, KVPoll.Success)
    states = link.flush()
    assert [(s.room, s.state) for s in states] == [(2, 3), (3, 4)]
    assert pushed == [states] and link.flush() == []
    assert link.state(1).state == 1 and link.state(3).state == 4


@pytest.mark.parametrize(
    ("answered", "state", "spins"),
    [
        ((4, 0), KVPoll.WaitingForInput, False),  # decode: the engine does not answer it
        ((4, 0), KVPoll.Success, True),  # decode: the engine's next Expect
        ((4, 0), KVPoll.Failed, True),
        ((4, 0, 2), KVPoll.WaitingForInput, True),  # prefill: the engine's Send
        ((4, 0, 2), KVPoll.Transferring, False),
    ],
)
def test_the_worker_spins_after_pushing_a_state_the_engine_answers(answered, state, spins):
    w = worker(300)
    pushed = []
    link = EngineLink(pushed.append)
    side = EngineSide(w, link, lambda cmd, now: None, answered)  # type: ignore[arg-type]
    assert w.owns_items is False and w.on_shutdown == [side.shutdown]
    link.report(5, state)
    before = time.monotonic()
    side.flush(link.since)  # the turn it was reported in
    if spins:
        assert [[(s.room, s.state) for s in b] for b in pushed] == [[(5, state)]]
        assert before + 300e-6 <= w.spin_until <= time.monotonic() + 300e-6
    else:
        assert pushed == [] and w.spin_until == 0.0  # shown later, unless something comes first
        assert side.idle_wait(0.01) <= SHOW_WITHIN  # the worker's sleep ends in time to show it
        side.flush(link.since + 2 * SHOW_WITHIN)
        assert [[(s.room, s.state) for s in b] for b in pushed] == [[(5, state)]]
        assert w.spin_until == 0.0 and side.idle_wait(0.01) == 0.01


def test_a_state_only_shown_is_overtaken_or_goes_with_the_next_urgent_one():
    pushed = []
    link = EngineLink(pushed.append)
    side = EngineSide(worker(0), link, lambda cmd, now: None)  # type: ignore[arg-type]
    link.report(1, KVPoll.WaitingForInput)
    link.report(2, KVPoll.WaitingForInput)
    side.flush(link.since)
    link.report(1, KVPoll.Success)  # room 1's WaitingForInput is never pushed: Success overtook it
    side.flush(link.since)
    assert [[(s.room, s.state) for s in b] for b in pushed] == [[(2, 2), (1, 4)]]
    link.report(3, KVPoll.Transferring)
    side.shutdown()  # the worker's end pushes whatever waits
    assert [(s.room, s.state) for s in pushed[-1]] == [(3, 3)]


def test_no_reply_spin_by_default_and_none_without_an_engine():
    w = worker(0)
    side = EngineSide(w, EngineLink(lambda states: None), lambda cmd, now: None)  # type: ignore[arg-type]
    side.link.report(5, KVPoll.Success)
    side.flush(time.monotonic())
    assert w.spin_until == 0.0
    spinning = worker(300)
    unpushed = EngineSide(spinning, EngineLink(None), lambda cmd, now: None)  # type: ignore[arg-type]
    unpushed.link.report(5, KVPoll.Success)
    unpushed.flush(time.monotonic())  # no engine connected: nothing was pushed, nothing to wait for
    assert spinning.spin_until == 0.0
