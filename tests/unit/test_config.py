"""The agent config: camelCase YAML/JSON in, one typed object out; bad input named precisely."""

from __future__ import annotations

import pytest

from dataplane.config import AgentConfig, NixlConfig, dump_config, parse_config
from dataplane.errors import BadInput


def test_round_trip_through_yaml_keeps_every_field() -> None:
    cfg = AgentConfig(role="decode", tp_rank=1)
    assert parse_config(dump_config(cfg)) == cfg


def test_yaml_keys_are_camel_case() -> None:
    text = dump_config(AgentConfig()).decode()
    assert "tpRank:" in text and "bootstrapPort:" in text and "tp_rank" not in text


def test_json_is_accepted() -> None:
    cfg = parse_config(b'{"role": "decode", "transfer": {"timeoutSeconds": 5}}')
    assert cfg.role == "decode" and cfg.transfer.timeout_seconds == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"role: bogus", "Invalid enum value 'bogus' - at `$.role`"),
        (b"transfer: {backend: tcp}", "at `$.transfer.backend`"),
        (b"listen: {hostt: 1.2.3.4}", "unknown field `hostt`"),
        (b"formatVersion: 9", "config formatVersion 9, this agent reads 1"),
        (b"role: [unclosed", "not valid YAML/JSON"),
        (b"transfer: {spinMicroseconds: -1}", "at `$.transfer.spinMicroseconds`"),
        (b"transfer: {spinMicroseconds: 200000}", "at `$.transfer.spinMicroseconds`"),
        (b"transfer: {coalesceBytes: -1}", "at `$.transfer.coalesceBytes`"),
        (b"transfer: {coalesceBytes: 67108865}", "at `$.transfer.coalesceBytes`"),
        (b"listen: {lanes: maybe}", "at `$.listen.lanes`"),
    ],
)
def test_bad_config_names_the_field(text: bytes, message: str) -> None:
    with pytest.raises(BadInput, match=r"^agent\.yaml: ") as info:
        parse_config(text, source="agent.yaml")
    assert message in str(info.value)


def test_tp_size_follows_the_role() -> None:
    cfg = parse_config(b"role: decode\nprefill: {tpSize: 1}\ndecode: {tpSize: 2}")
    assert cfg.tp_size == 2


def test_nixl_progress_thread_unset_is_off_for_a_host_prefill_only_and_a_set_value_stays() -> None:
    unset = NixlConfig()
    assert unset.progress_thread is None
    assert unset.for_role("prefill").progress_thread is False
    assert unset.for_role("decode").progress_thread is True
    assert unset.for_role("prefill", "cuda").progress_thread is True  # GPU pools: not measured without
    for value in (True, False):
        assert NixlConfig(progress_thread=value).for_role("prefill").progress_thread is value
        assert NixlConfig(progress_thread=value).for_role("decode").progress_thread is value
