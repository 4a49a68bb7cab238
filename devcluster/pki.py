"""Certificates, keys and kubeconfigs for the local control plane (openssl CLI).

Role: make a throw-away CA, the kube-apiserver serving certificate (valid for
127.0.0.1/localhost only, plus the in-cluster service names), one client
certificate per component, the service-account signing key pair, and a
kubeconfig per identity. ECDSA P-256 keys keep generation well under a second.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

DAYS = "30"
SERVER_SANS = (
    "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
    "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1"
)

# identity name -> (common name, organisation or "")
CLIENTS: dict[str, tuple[str, str]] = {
    "admin": ("pdpair-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", ""),
    "scheduler": ("system:kube-scheduler", ""),
    "kwok": ("kwok-controller", "system:masters"),
}


@dataclass(frozen=True)
class Pki:
    """Paths of the generated material in one directory."""

    root: Path

    @property
    def ca_crt(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def server_crt(self) -> Path:
        return self.root / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        return self.root / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.root / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.root / "sa.pub"

    def client_crt(self, name: str) -> Path:
        return self.root / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.root / f"{name}.key"

    def kubeconfig(self, name: str) -> Path:
        return self.root.parent / f"{name}.kubeconfig"


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def _ec_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    path.chmod(0o600)


def _subject(cn: str, org: str) -> str:
    return f"/O={org}/CN={cn}" if org else f"/CN={cn}"


def _signed_cert(pki: Pki, key: Path, crt: Path, subject: str, extensions: str) -> None:
    csr = crt.with_suffix(".csr")
    ext = crt.with_suffix(".ext")
    ext.write_text(extensions)
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(pki.ca_crt),
        "-CAkey",
        str(pki.ca_key),
        "-CAcreateserial",
        "-days",
        DAYS,
        "-extfile",
        str(ext),
        "-out",
        str(crt),
    )
    csr.unlink()
    ext.unlink()


def _make_ca(pki: Pki) -> None:
    _ec_key(pki.ca_key)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(pki.ca_key),
        "-subj",
        "/CN=pdpair-devcluster-ca",
        "-days",
        DAYS,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out",
        str(pki.ca_crt),
    )


def _make_server(pki: Pki) -> None:
    _ec_key(pki.server_key)
    ext = (
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={SERVER_SANS}\n"
    )
    _signed_cert(pki, pki.server_key, pki.server_crt, "/CN=kube-apiserver", ext)


def _make_client(pki: Pki, name: str) -> None:
    cn, org = CLIENTS[name]
    _ec_key(pki.client_key(name))
    ext = (
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n"
    )
    _signed_cert(pki, pki.client_key(name), pki.client_crt(name), _subject(cn, org), ext)


def _make_sa_keys(pki: Pki) -> None:
    _ec_key(pki.sa_key)
    _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))


def write_kubeconfig(
    path: Path, server: str, ca: Path, crt: Path, key: Path, name: str = "pdpair-dev"
) -> None:
    """Write a kubeconfig with one cluster/user/context, all named ``name``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def generate(root: Path, server: str) -> Pki:
    """Create the CA, serving/client certificates, SA keys and kubeconfigs under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    pki = Pki(root)
    _make_ca(pki)
    _make_server(pki)
    _make_sa_keys(pki)
    for name in CLIENTS:
        _make_client(pki, name)
        write_kubeconfig(pki.kubeconfig(name), server, pki.ca_crt, pki.client_crt(name), pki.client_key(name))
    return pki
