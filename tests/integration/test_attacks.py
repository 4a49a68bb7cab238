"""A stranger's attacks on a real prefill/decode pair's sockets, HTTP endpoints, listeners and local API
(``dataplane.harness.bench.attacks``, the same functions ``pdpair-agent bench attacks`` tabulates in
docs/security.md; the attacks on pairing are in test_security_peers.py): each asserts its bound held
and that the pair kept serving, every room verified."""

from __future__ import annotations

import os

import pytest

from dataplane.harness.bench import attacks as a

pytestmark = [pytest.mark.nixl, pytest.mark.slow]


@pytest.fixture(scope="module")
def pair():
    with a.running_pair() as running:
        yield running


def kept_serving(finding: a.Finding) -> None:
    assert finding.figures["kept_serving"], (finding.outcome, finding.figures)


def test_metadata_naming_1100_unregistered_ports_leaves_descriptors_bounded_and_the_worker_alive(pair):
    f = a.unregistered_ports(pair)
    assert f.figures["handled"] and f.figures["live"], f.outcome
    assert f.figures["fds_after"] <= f.figures["fd_bound"], f.outcome
    assert f.figures["fds_after"] - f.figures["fds_before"] <= 64, f.outcome
    assert f.figures["control"]["open_sockets"] <= a.STRANGER_SOCKETS + 1, f.figures["control"]
    kept_serving(f)
    assert f.passed


def test_sixteen_messages_at_the_cap_and_sixteen_of_60_mb_leave_rss_bounded(pair):
    f = a.big_messages(pair)
    assert f.figures["cap"] < 2 << 20  # the qwen3-next test pair's schema needs about 1 MiB
    assert f.figures["rejected_at_cap"] == 16 and f.figures["live"], f.outcome
    assert f.figures["60mb_reached_worker"] == 0, f.outcome  # over the cap: ZMQ drops them unread
    for peak in (f.figures["peak_at_cap"], f.figures["peak_60mb"]):
        assert peak - f.figures["rss_before"] <= f.figures["rss_bound"], f.outcome
    kept_serving(f)
    assert f.passed


def test_a_flood_of_malformed_messages_is_counted_not_logged(pair):
    f = a.log_flood(pair)
    assert f.figures["rejected"] == 10_000 and f.figures["log_lines"] <= 10, f.outcome
    kept_serving(f)
    assert f.passed


def test_put_ranks_unsigned_or_badly_signed_is_refused(pair):
    f = a.put_ranks(pair)
    assert f.figures["codes"] == [401, 401, 401], f.outcome
    assert all(r["host"] == "127.0.0.1" for r in f.figures["ranks"])


def test_strangers_learn_no_address_from_topology_or_status(pair):
    f = a.address_leak(pair)
    assert f.figures["leaked"] == [] and f.figures["signed_topology_ranks"] == 1, f.outcome


def test_every_listener_of_an_agent_told_127_0_0_1_is_on_127_0_0_1(pair):
    f = a.listeners(pair)
    for tag, addresses in f.figures["listeners"].items():
        assert addresses, tag
        assert all(addr.startswith("127.0.0.1:") for addr in addresses), (tag, addresses)
    assert f.passed


def test_a_process_of_another_uid_on_the_local_api_is_refused_and_the_engine_then_served(pair):
    if os.getuid() != 0:
        pytest.skip("acting as another uid needs root; test_localapi_server checks the refusal as any user")
    f = a.local_api_stranger(pair)
    assert f.figures["answer"].startswith("forbidden: uid 65534 may not use"), f.outcome
    assert f.figures["logged"] and f.figures["counted"] == 1 and f.figures["engine_exit"] == 0, f.outcome
    assert f.figures["counts"]["verified"] == 12 and f.figures["counts"].get("failed", 0) == 0, f.figures
    assert f.passed


def test_the_table_has_a_row_per_attack():
    finding = a.Finding("x", "y", "z", False)
    rows = a.table([finding]).splitlines()
    assert rows[0] == "| attack | outcome | bound | held |" and rows[2] == "| x | y | z | NO |"
    assert len(a.ATTACKS) >= 14
