"""Rendering sidecar mode: a PDPair that names an engine image (or asks for the sidecar) gets pods of
two containers — the agent in external-engine mode and the engine — sharing the local API's socket
through an emptyDir; without ``spec.engine`` pods stay as they were (the agent's in-process canary)."""

from __future__ import annotations

from operator_world import make_owner
from pdpair_operator import render
from pdpair_operator.spec import generation_hash

from dataplane.config import parse_config


def pod_and_config(role="decode", **spec):
    owner = make_owner(**spec)
    gen = generation_hash(owner.spec)
    pod = render.build_pod(owner, gen, role, 0)
    cfg = parse_config(render.build_config_map(owner, gen)["data"][f"{role}.yaml"])
    return pod["spec"], cfg


def mounts(container):
    return {m["name"]: m["mountPath"] for m in container["volumeMounts"]}


def test_named_engine_image_runs_beside_the_agent_sharing_the_socket_volume():
    engine = {"image": "lmsys/sglang:v0.5.23", "command": ["python3", "-m", "sglang.launch_server"],
              "args": ["--disaggregation-mode", "decode"], "env": [{"name": "HF_HOME", "value": "/cache"}]}
    spec, cfg = pod_and_config(engine=engine)
    agent, eng = spec["containers"]
    assert (agent["name"], eng["name"]) == ("agent", "engine")
    assert eng["image"] == "lmsys/sglang:v0.5.23" and eng["command"][-1] == "sglang.launch_server"
    assert eng["args"] == ["--disaggregation-mode", "decode"]
    env = {e["name"]: e["value"] for e in eng["env"]}
    assert env == {"PDPAIR_AGENT_SOCKET": "/var/run/pdpair/agent.sock", "HF_HOME": "/cache"}
    assert mounts(agent)["localapi"] == mounts(eng)["localapi"] == "/var/run/pdpair"
    assert {"name": "localapi", "emptyDir": {}} in spec["volumes"]
    assert cfg.localapi.engine.mode == "external"
    assert cfg.localapi.engine.socket_path == "/var/run/pdpair/agent.sock"
    assert cfg.localapi.engine.reply_spin_microseconds == 200


def test_reply_spin_reaches_the_sidecar_agents_config():
    _, cfg = pod_and_config(engine={"mode": "sidecar", "replySpinMicroseconds": 0})
    assert cfg.localapi.engine.reply_spin_microseconds == 0


def test_sidecar_without_image_runs_the_synthetic_engine_as_the_canary():
    spec, cfg = pod_and_config(role="prefill", engine={"mode": "sidecar"})
    agent, eng = spec["containers"]
    assert eng["image"] == agent["image"] == "img:1"
    assert eng["command"][:4] == ["pdpair-agent", "engine", "--role", "prefill"]
    assert eng["command"][-2:] == ["--socket", "/var/run/pdpair/agent.sock"]
    assert mounts(eng)["agent-config"] == "/etc/pdpair/config"
    assert "pairing" not in mounts(eng) and mounts(agent)["pairing"] == "/etc/pdpair/pairing"
    assert eng["securityContext"] == agent["securityContext"]
    assert cfg.localapi.engine.mode == "external"


def test_engine_resources_and_huge_pages_go_to_the_engine_container_only():
    resources = {"cpu": "4", "memory": "16Gi", "hugePages": "2Gi"}
    spec, _ = pod_and_config(engine={"mode": "sidecar", "resources": resources})
    agent, eng = spec["containers"]
    storage = {"ephemeral-storage": "256Mi"}
    assert eng["resources"]["requests"] == {"cpu": "4", "memory": "16Gi", "hugepages-2Mi": "2Gi", **storage}
    assert eng["resources"]["limits"] == {"nvidia.com/gpu": "1", "hugepages-2Mi": "2Gi", "cpu": "4",
                                          "memory": "16Gi", "ephemeral-storage": "1Gi"}
    assert "hugepages-2Mi" not in str(agent.get("resources"))
    spec, _ = pod_and_config(engine={"mode": "sidecar"})
    limits = spec["containers"][1]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1" and "hugepages-2Mi" not in limits


def test_default_pods_keep_the_in_process_engine():
    spec, cfg = pod_and_config()
    [agent] = spec["containers"]
    assert "localapi" not in mounts(agent)
    assert cfg.localapi.engine.mode == "synthetic"


def test_naming_an_engine_is_a_new_generation():
    plain, named = make_owner(), make_owner(engine={"image": "e:1"})
    assert generation_hash(plain.spec) != generation_hash(named.spec)
