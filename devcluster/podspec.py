"""Turn one container of a pod object into a local command line, environment and files.

Role: the pure part of the pod runner. Given the pod (as the API returns it), a
container, the loopback address standing in for the pod IP, and a lookup for
ConfigMaps/Secrets, it resolves ``env`` (values, ``$(VAR)`` references,
downward-API ``fieldRef``/``resourceFieldRef``, ``configMapKeyRef``/``secretKeyRef``),
``envFrom``, and the ConfigMap/Secret/downwardAPI/projected (ServiceAccount tokens
from a token source included)/emptyDir volumes the container mounts (written under a
local directory; every mount path appearing in command, args, env values or mounted
text files is rewritten to that directory).
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

HOST_ADDRESS = "127.0.0.1"
# kind ("ConfigMap"/"Secret"), namespace, name -> decoded data, or None if absent
Lookup = Callable[[str, str, str], "dict[str, bytes] | None"]
# the pod, a projected volume's serviceAccountToken source -> the token (a TokenRequest's answer)
TokenSource = Callable[[Mapping[str, Any], Mapping[str, Any]], bytes]


class PodSpecError(ValueError):
    """The container cannot be run locally as specified."""


@dataclass
class LocalContainer:
    """What it takes to run one container as a local process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    mounts: dict[str, Path] = field(default_factory=dict)


# ---------------------------------------------------------------- downward API
_KEYED = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: Mapping[str, Any], path: str, address: str) -> str:
    """Value of a downward-API ``fieldRef.fieldPath``; pod IPs become ``address``."""
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    keyed = _KEYED.match(path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": address,
        "status.podIPs": address,
        "status.hostIP": HOST_ADDRESS,
        "status.hostIPs": HOST_ADDRESS,
    }
    if path in simple:
        return str(simple[path])
    if path in ("metadata.labels", "metadata.annotations"):
        items = sorted((meta.get(path.split(".")[1]) or {}).items())
        return "\n".join(f'{k}="{v}"' for k, v in items)
    raise PodSpecError(f"unsupported fieldRef {path!r}")


_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes quantity such as ``500m``, ``2Gi`` or ``4``."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise PodSpecError(f"unsupported quantity {text!r}")
    return Decimal(match.group(1)) * _SUFFIX[match.group(2)]


def resource_value(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """Value of a ``resourceFieldRef`` (limits fall back to requests, then 0), rounded up."""
    kind, _, resource = str(ref["resource"]).partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(resource) or (resources.get("requests") or {}).get(resource) or "0"
    divisor = parse_quantity(str(ref.get("divisor") or "1"))
    return str(math.ceil(parse_quantity(str(raw)) / divisor))


# ---------------------------------------------------------------- env
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names replaced, ``$$`` escapes, unknown kept."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REF.sub(sub, text)


def _decoded(kind: str, obj: Mapping[str, Any]) -> dict[str, bytes]:
    if kind == "Secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()} | {
            k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()
        }
    data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    return data | {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}


def decode_object(obj: Mapping[str, Any]) -> dict[str, bytes]:
    """The data of a ConfigMap or Secret object, as bytes."""
    return _decoded(str(obj.get("kind")), obj)


def _key_ref(kind: str, ref: Mapping[str, Any], namespace: str, lookup: Lookup) -> str | None:
    data = lookup(kind, namespace, str(ref["name"]))
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise PodSpecError(f"{kind} {namespace}/{ref['name']} has no key {ref['key']!r}")
    return data[ref["key"]].decode(errors="replace")


def _env_from(container: Mapping[str, Any], namespace: str, lookup: Lookup) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        kind, ref = (
            ("ConfigMap", source["configMapRef"])
            if "configMapRef" in source
            else ("Secret", source["secretRef"])
        )
        data = lookup(kind, namespace, str(ref["name"]))
        if data is None:
            if ref.get("optional"):
                continue
            raise PodSpecError(f"envFrom: {kind} {namespace}/{ref['name']} not found")
        prefix = source.get("prefix", "")
        env.update({prefix + k: v.decode(errors="replace") for k, v in data.items()})
    return env


def _env_value(item: Mapping[str, Any], ctx: _Context, env: Mapping[str, str]) -> str | None:
    if "valueFrom" not in item:
        return expand(str(item.get("value", "")), env)
    source = item["valueFrom"]
    if "fieldRef" in source:
        return field_value(ctx.pod, source["fieldRef"]["fieldPath"], ctx.address)
    if "resourceFieldRef" in source:
        return resource_value(ctx.container, source["resourceFieldRef"])
    if "configMapKeyRef" in source:
        return _key_ref("ConfigMap", source["configMapKeyRef"], ctx.namespace, ctx.lookup)
    if "secretKeyRef" in source:
        return _key_ref("Secret", source["secretKeyRef"], ctx.namespace, ctx.lookup)
    raise PodSpecError(f"unsupported valueFrom in env {item.get('name')!r}: {sorted(source)}")


def container_env(ctx: _Context) -> dict[str, str]:
    """The container's environment as the kubelet would build it (envFrom, then env)."""
    env = _env_from(ctx.container, ctx.namespace, ctx.lookup)
    for item in ctx.container.get("env") or []:
        value = _env_value(item, ctx, env)
        if value is not None:
            env[str(item["name"])] = value
    return env


@dataclass
class _Context:
    pod: Mapping[str, Any]
    container: Mapping[str, Any]
    address: str
    lookup: Lookup
    token: TokenSource | None = None

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"].get("namespace", "default"))


# ---------------------------------------------------------------- volumes
def _items(data: Mapping[str, bytes], items: Sequence[Mapping[str, Any]] | None) -> dict[str, bytes]:
    if not items:
        return dict(data)
    return {str(i["path"]): data[i["key"]] for i in items if i["key"] in data}


def _object_files(kind: str, source: Mapping[str, Any], ctx: _Context) -> dict[str, bytes]:
    name = str(source.get("name") or source.get("secretName"))
    data = ctx.lookup(kind, ctx.namespace, name)
    if data is None:
        if source.get("optional"):
            return {}
        raise PodSpecError(f"volume: {kind} {ctx.namespace}/{name} not found")
    return _items(data, source.get("items"))


def _downward_files(source: Mapping[str, Any], ctx: _Context) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for item in source.get("items") or []:
        if "fieldRef" in item:
            files[str(item["path"])] = field_value(
                ctx.pod, item["fieldRef"]["fieldPath"], ctx.address
            ).encode()
        elif "resourceFieldRef" in item:
            files[str(item["path"])] = resource_value(ctx.container, item["resourceFieldRef"]).encode()
    return files


def _projected_files(source: Mapping[str, Any], ctx: _Context) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for part in source.get("sources") or []:
        if "configMap" in part:
            files.update(_object_files("ConfigMap", part["configMap"], ctx))
        elif "secret" in part:
            files.update(_object_files("Secret", part["secret"], ctx))
        elif "downwardAPI" in part:
            files.update(_downward_files(part["downwardAPI"], ctx))
        elif "serviceAccountToken" in part:
            if ctx.token is None:
                raise PodSpecError("a serviceAccountToken volume source, but no token source")
            files[str(part["serviceAccountToken"]["path"])] = ctx.token(ctx.pod, part["serviceAccountToken"])
    return files


def volume_files(volume: Mapping[str, Any], ctx: _Context) -> dict[str, bytes] | None:
    """Files of a volume by relative path; None for volumes that are plain directories."""
    if "configMap" in volume:
        return _object_files("ConfigMap", volume["configMap"], ctx)
    if "secret" in volume:
        return _object_files("Secret", volume["secret"], ctx)
    if "downwardAPI" in volume:
        return _downward_files(volume["downwardAPI"], ctx)
    if "projected" in volume:
        return _projected_files(volume["projected"], ctx)
    return None


# ---------------------------------------------------------------- path rewriting
def rewrite_paths(text: str, mounts: Mapping[str, Path]) -> str:
    """Replace every mount path (at a path boundary) in ``text`` by its local directory.

    One pass over all mount paths, longest first: the local directories usually lie under ``/tmp``,
    so rewriting mount by mount would rewrite a ``/tmp`` mount inside an already substituted path.
    """
    local = {m.rstrip("/") or "/": str(d) for m, d in mounts.items()}
    if not local:
        return text
    alternatives = "|".join(re.escape(m) for m in sorted(local, key=len, reverse=True))
    pattern = rf"(?<![\w.\-/])({alternatives})(?=$|[/\s\"',:;=)\]}}])"
    return re.sub(pattern, lambda match: local[match.group(1)], text)


def _write_files(root: Path, files: Mapping[str, bytes]) -> None:
    for rel, content in files.items():
        target = root / rel
        if not target.resolve().is_relative_to(root.resolve()):
            raise PodSpecError(f"volume item path escapes the volume: {rel!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _rewrite_text_files(root: Path, mounts: Mapping[str, Path]) -> None:
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        try:
            text = path.read_bytes().decode()
        except UnicodeDecodeError:
            continue
        new = rewrite_paths(text, mounts)
        if new != text:
            path.write_text(new)


def materialize_volumes(ctx: _Context, root: Path, shared: Path | None = None) -> dict[str, Path]:
    """Write the container's mounted volumes under ``root``; return mountPath -> local path.

    Volumes with files (ConfigMap, Secret, downward API, projected) are the container's own copies, their
    text rewritten to its mounts; directory volumes (emptyDir and the rest) live under ``shared`` (default
    ``root``), where the pod's containers share them, as they share an emptyDir in a pod."""
    volumes = {v["name"]: v for v in ctx.pod.get("spec", {}).get("volumes") or []}
    mounts: dict[str, Path] = {}
    written: list[Path] = []
    for mount in ctx.container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise PodSpecError(f"volumeMount {mount['name']!r} has no volume")
        files = volume_files(volume, ctx)
        local = (root if files is not None else shared or root) / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        if files is not None:
            _write_files(local, files)
            written.append(local)
        sub = mount.get("subPath")
        mounts[str(mount["mountPath"])] = local / sub if sub else local
    for local in written:
        _rewrite_text_files(local, mounts)
    return mounts


# ---------------------------------------------------------------- command
def local_argv(
    container: Mapping[str, Any], commands: Mapping[str, Sequence[str]]
) -> tuple[list[str], list[str]] | None:
    """Map the container's command (or image/name when it has none) to a local argv prefix.

    Returns (local prefix, the container's remaining arguments): only the latter are the pod's own
    words, subject to ``$(VAR)`` expansion and mount-path rewriting; the prefix is a local command line.
    """
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if command:
        for key in (command[0], os.path.basename(command[0])):
            if key in commands:
                return list(commands[key]), [*command[1:], *args]
        return None
    image = str(container.get("image", ""))
    for key in (image, image.rsplit(":", 1)[0], str(container.get("name"))):
        if key in commands:
            return list(commands[key]), args
    return None


def resolve_container(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    address: str,
    lookup: Lookup,
    commands: Mapping[str, Sequence[str]],
    volume_root: Path,
    token: TokenSource | None = None,
    shared_root: Path | None = None,
) -> LocalContainer | None:
    """Everything needed to run ``container`` locally, or None if no command mapping fits. ``token``
    answers projected ``serviceAccountToken`` sources (the kubelet's TokenRequest); ``shared_root``:
    where the pod's directory volumes live (``materialize_volumes``)."""
    mapped = local_argv(container, commands)
    if mapped is None:
        return None
    prefix, rest = mapped
    ctx = _Context(pod, container, address, lookup, token)
    mounts = materialize_volumes(ctx, volume_root, shared_root)
    env = {k: rewrite_paths(v, mounts) for k, v in container_env(ctx).items()}
    argv = [*prefix, *(rewrite_paths(expand(a, env), mounts) for a in rest)]
    env["PODRUNNER_MOUNTS"] = json.dumps({k: str(v) for k, v in mounts.items()})
    working = container.get("workingDir")
    cwd = Path(rewrite_paths(str(working), mounts)) if working else volume_root.parent
    if not cwd.is_dir():
        cwd = volume_root.parent
    return LocalContainer(str(container["name"]), argv, env, cwd, mounts)
