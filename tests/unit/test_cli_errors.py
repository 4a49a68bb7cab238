"""A user's mistake on either command line is one line on stderr that names the input, with a non-zero
exit and no traceback: each case runs the real command as a subprocess."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pdpair_operator.cli import build_parser as operator_parser

from dataplane.cli import build_parser as agent_parser
from dataplane.config import parse_config
from dataplane.errors import BadInput
from dataplane.schema.profiles import profile_names

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]),
}
AGENT = [sys.executable, "-m", "dataplane.cli"]
OPERATOR = [sys.executable, "-m", "pdpair_operator.cli"]

# (argv after the command, words the one line must contain)
FLAG_CASES = [
    (["demo", "--requests", "-5"], ["--requests", "-5", "1 to 1,000,000"]),
    (["demo", "--requests", "many"], ["--requests", "'many'"]),
    (["demo", "--tokens", "1024,-2"], ["--tokens", "-2"]),
    (["demo", "--tokens", ","], ["--tokens"]),
    (["demo", "--inflight", "0"], ["--inflight", "0"]),
    (["demo", "--inflight", "33"], ["--inflight", "33"]),
    (["demo", "--prefill-tp", "0"], ["--prefill-tp", "0"]),
    (["demo", "--decode-tp", "9"], ["--decode-tp", "9"]),
    (["demo", "--timeout", "0"], ["--timeout", "0"]),
    (["demo", "--timeout", "nan"], ["--timeout", "nan"]),
    (["demo", "--hold", "-1"], ["--hold", "-1"]),
    (["demo", "--profile", "llama"], ["--profile", "'llama'", *profile_names()]),
    (["demo", "--backend", "rdma"], ["--backend", "'rdma'", "nixl", "cuda-ipc"]),
    (["bench", "transfer", "--sizes", "4K,2G"], ["--sizes", "2G", "256M"]),
    (["bench", "transfer", "--sizes", "4Q"], ["--sizes", "'4Q'"]),
    (["bench", "transfer", "--case-bytes", "10"], ["--case-bytes", "10"]),
    (["bench", "transfer", "--max-requests", "0"], ["--max-requests", "0"]),
    (["bench", "transfer", "--repeat", "0"], ["--repeat", "0"]),
    (["bench", "transfer", "--warmup", "-1"], ["--warmup", "-1"]),
    (["bench", "transfer", "--inflight", "65"], ["--inflight", "65"]),
    (["bench", "transfer", "--nixl-threads", "65"], ["--nixl-threads", "65"]),
    (["bench", "transfer", "--spin-us", "-1"], ["--spin-us", "-1"]),
    (["bench", "transfer", "--coalesce-bytes", "65M"], ["--coalesce-bytes", "65M"]),
    (["bench", "transfer", "--mix", "llama"], ["--mix", "'llama'", "qwen3-next"]),
    (["bench", "transfer", "--tp-rooms", "qwen3-next:1"], ["--tp-rooms", "PROFILE:P-D"]),
    (["bench", "transfer", "--tp-rooms", "llama:1-2"], ["--tp-rooms", "'llama'", "qwen3-next"]),
    (["bench", "transfer", "--tp-rooms", "pure-kv:3-1"], ["--tp-rooms", "TP 3", "power of two"]),
    (["bench", "transfer", "--tp-rooms", "pure-kv:16-1"], ["--tp-rooms", "16", "1 to 8"]),
    (["bench", "transfer", "--tp-rooms", "pure-kv:2-2"], ["--tp-rooms", "equal"]),
    (["bench", "transfer", "--tp-rooms", "qwen3-next:1-4"], ["--tp-rooms qwen3-next:1-4", "kv buffer"]),
    (["bench", "transfer", "--sizes=", "--mix=", "--tp-rooms="], ["--tp-rooms ''", "nothing to measure"]),
    (["bench", "codec", "--iterations", "0"], ["--iterations", "0"]),
    (["bench", "codec", "--rounds", "0"], ["--rounds", "0"]),
    (["bench", "codec", "--cpu", "-1"], ["--cpu", "-1"]),
    (["bench", "codec", "--cpu", "65535"], ["--cpu 65535", "may run on CPUs"]),
    (["sidecar-bench", "--sizes", "0"], ["--sizes", "0"]),
    (["sidecar-bench", "--sizes=", "--mix="], ["--sizes ''", "nothing to measure"]),
    (["sidecar-bench", "--case-bytes", "1T1"], ["--case-bytes", "'1T1'"]),
    (["sidecar-bench", "--max-requests", "0"], ["--max-requests", "0"]),
    (["sidecar-bench", "--inflight", "0"], ["--inflight", "0"]),
    (["sidecar-bench", "--repeat", "101"], ["--repeat", "101"]),
    (["sidecar-bench", "--warmup", "-1"], ["--warmup", "-1"]),
    (["sidecar-bench", "--engine-poll-us", "-1"], ["--engine-poll-us", "-1"]),
    (["sidecar-bench", "--reply-spin-us", "100001"], ["--reply-spin-us", "100001"]),
    (["engine", "--role", "decode", "--tp-rank", "-1"], ["--tp-rank", "-1"]),
    (["engine", "--role", "decode", "--requests", "-1"], ["--requests", "-1"]),
    (["engine", "--role", "decode", "--tokens", "x"], ["--tokens", "'x'"]),
    (["engine", "--role", "decode", "--inflight", "0"], ["--inflight", "0"]),
    (["engine", "--role", "decode", "--room-base", "-1"], ["--room-base", "-1"]),
    (["engine", "--role", "decode", "--duration", "-1"], ["--duration", "-1"]),
    (["engine", "--role", "decode", "--timeout", "0"], ["--timeout", "0"]),
    (["engine", "--role", "decode", "--presend", "-1"], ["--presend", "-1"]),
    (["engine", "--role", "decode", "--poll-us", "-1"], ["--poll-us", "-1"]),
    (["engine", "--role", "decode", "--profile", "llama"], ["--profile", "'llama'"]),
    (["engine", "--role", "decode", "--log-level", "loud"], ["--log-level", "'loud'", "DEBUG"]),
    (["run", "--role", "prefill", "--config", "x.yaml", "--log-level", "loud"], ["--log-level", "'loud'"]),
    (["run", "--role", "prefill", "--config", "x.yaml", "--tp-rank", "-1"], ["--tp-rank", "-1"]),
    (["run", "--role", "middle", "--config", "x.yaml"], ["--role", "'middle'", "prefill", "decode"]),
    (["run", "--role", "prefill", "--config", "x", "--ready-file", "/no/d/r"], ["--ready-file", "/no/d"]),
    (["engine", "--role", "decode", "--report", "/no/such/dir/r.json"], ["--report", "/no/such/dir"]),
    (["bench", "transfer", "--record", "/no/such/dir/BENCH.md"], ["--record", "/no/such/dir"]),
    ([], ["COMMAND"]),
    (["wire", "encode"], ["--kind"]),
]


def one_line_error(argv: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> str:
    """Run a command; it must fail with exactly one line on stderr and no traceback. Returns the line."""
    proc = subprocess.run(argv, cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=timeout)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize(("argv", "words"), FLAG_CASES, ids=[" ".join(a) or "-" for a, _ in FLAG_CASES])
def test_agent_flag_out_of_range_is_one_line(argv: list[str], words: list[str]) -> None:
    line = one_line_error(AGENT + argv)
    for word in words:
        assert word in line, line


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    (tmp_path / "typo.yaml").write_text("model:\n  pagesize: 16\n")
    (tmp_path / "broken.yaml").write_text("model: [\n")
    (tmp_path / "cfgdir").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("missing.yaml", ["missing.yaml", "No such file"]),
        ("cfgdir", ["cfgdir", "cannot read", "Is a directory"]),
        ("typo.yaml", ["typo.yaml", "`pagesize`", "did you mean `pageSize`?"]),
        ("broken.yaml", ["broken.yaml", "not valid YAML/JSON", "line 2"]),
    ],
)
def test_agent_run_config_mistake_is_one_line(config_dir: Path, name: str, words: list[str]) -> None:
    line = one_line_error([*AGENT, "run", "--role", "prefill", "--config", str(config_dir / name)])
    for word in words:
        assert word in line, line


def test_agent_run_on_a_taken_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config, key = tmp_path / "agent.yaml", tmp_path / "pairing.key"
        key.write_bytes(os.urandom(32))
        config.write_text(f"listen:\n  host: 127.0.0.1\n  bootstrapPort: 0\n  metricsPort: {port}\n"
                          f"auth:\n  keyFile: {key}\n")
        env = {**ENV, "NIXL_LOG_LEVEL": "WARN"}  # NIXL's own INFO lines at start-up
        line = one_line_error([*AGENT, "run", "--role", "prefill", "--config", str(config)], env)
    assert f"listen.host 127.0.0.1 (--listen-host), ports metrics {port}: cannot listen" in line, line
    assert "Address already in use" in line, line


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("model:\n  pagesize: 16\n", "did you mean `pageSize`?"),
        ("transfer:\n  nixl:\n    ucxtls: tcp\n", "at `$.transfer.nixl`; did you mean `ucxTls`?"),
        ("model:\n  components:\n    - name: a\n      statetype: x\n", "did you mean `stateType`?"),
        ("localapi:\n  engine:\n    socketpath: /x\n", "did you mean `socketPath`?"),
        ("zzzz: 1\n", "keys there: formatVersion, role, tpRank, model"),
    ],
)
def test_unknown_config_key_names_the_nearest_existing_one(text: str, hint: str) -> None:
    with pytest.raises(BadInput) as err:
        parse_config(text, source="agent.yaml")
    assert hint in str(err.value)


def test_version_on_both_commands() -> None:
    for argv, prog in ((AGENT, "pdpair-agent"), (OPERATOR, "pdpair-operator")):
        proc = subprocess.run(
            [*argv, "--version"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0 and re.fullmatch(rf"{prog} \d+\.\d+\S*\n", proc.stdout), proc


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


RST = re.compile(r"``|:[a-z]+:`|\*\*")


def test_help_texts_have_no_restructuredtext_markup() -> None:
    helps = {p.prog: p.format_help() for root in (agent_parser(), operator_parser()) for p in _parsers(root)}
    assert len(helps) >= 9  # both commands, every subcommand
    for prog, text in helps.items():
        assert not RST.search(text), f"{prog}: {RST.search(text)}"


def test_help_texts_list_profiles_and_backends() -> None:
    helps = {p.prog: p.format_help() for p in _parsers(agent_parser())}
    for prog in ("pdpair-agent demo", "pdpair-agent bench transfer", "pdpair-agent sidecar-bench",
                 "pdpair-agent engine"):
        for name in profile_names():
            assert name in helps[prog], (prog, name)
    assert "{nixl,cuda-ipc}" in helps["pdpair-agent demo"]


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters:\n- name: c\n  cluster: {{server: '{server}', insecure-skip-tls-verify: true}}\n"
        "users:\n- name: u\n  user: {token: t}\n"
        "contexts:\n- name: x\n  context: {cluster: c, user: u}\n"
    )
    return path


def _operator_env(tmp_path: Path, kubeconfig: Path | None) -> dict[str, str]:
    env = {k: v for k, v in ENV.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def test_operator_without_kubeconfig_is_one_line(tmp_path: Path) -> None:
    line = one_line_error([*OPERATOR, "--connect-timeout", "1"], _operator_env(tmp_path, tmp_path / "none"))
    assert "no kubeconfig at" in line and str(tmp_path / "none") in line and "KUBECONFIG" in line, line


def test_operator_with_a_malformed_kubeconfig_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [\n")
    line = one_line_error([*OPERATOR, "--connect-timeout", "1"], _operator_env(tmp_path, bad))
    assert f"the kubeconfig {bad} is unusable" in line, line


@pytest.mark.parametrize(
    ("listening", "reason"),
    [(False, "Connection refused"), (True, "connected, but no response: read timed out")],
    ids=["closed-port", "accepts-but-never-answers"],
)
def test_operator_gives_up_on_a_silent_api_server_after_the_connect_timeout(
    tmp_path: Path, listening: bool, reason: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        if listening:
            sock.listen()
        port = sock.getsockname()[1]
        if not listening:
            sock.close()
        server = f"https://127.0.0.1:{port}"
        env = _operator_env(tmp_path, _kubeconfig(tmp_path / "kc.yaml", server))
        started = time.monotonic()
        line = one_line_error([*OPERATOR, "--connect-timeout", "1.5"], env, timeout=30)
    assert time.monotonic() - started < 25  # bounded: kopf would retry forever
    assert f"the API server at {server} did not answer within 1.5s ({reason})" in line, line
    assert "--connect-timeout" in line


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--metrics-port", "70000"], ["--metrics-port", "70000"]),
        (["--concurrency", "0"], ["--concurrency", "0"]),
        (["--connect-timeout", "0"], ["--connect-timeout", "0"]),
        (["--log-format", "xml"], ["--log-format", "'xml'"]),
    ],
)
def test_operator_flag_out_of_range_is_one_line(argv: list[str], words: list[str]) -> None:
    line = one_line_error(OPERATOR + argv)
    for word in words:
        assert word in line, line


@pytest.mark.parametrize(("service_env", "words"), [
    ({}, ["Service host/port is not set"]),
    ({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"},
     ["Service token file does not exist", "projected token volume"]),
])
def test_agent_run_without_a_service_account_token_is_one_line(
        tmp_path: Path, service_env: dict[str, str], words: list[str]) -> None:
    """An agent told to report as its pod's ServiceAccount, without a usable token, stops at once: it
    never falls back to another identity and never runs without reporting."""
    config = tmp_path / "agent.yaml"
    config.write_text("identity:\n  namespace: ns\n  podName: pod-0\n")
    env = {k: v for k, v in ENV.items() if not k.startswith("KUBERNETES_")} | service_env
    line = one_line_error([*AGENT, "run", "--role", "prefill", "--config", str(config),
                           "--service-account-dir", str(tmp_path / "none")], env=env)
    for word in ["--service-account-dir", str(tmp_path / "none"), *words]:
        assert word in line, line
