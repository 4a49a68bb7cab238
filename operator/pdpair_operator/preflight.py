"""Before kopf starts: Kubernetes credentials and an API server that answers, within a bounded wait.

kopf itself retries a missing or silent API server forever with a traceback per attempt; a user who
started the operator against the wrong kubeconfig gets one line naming what is missing instead.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from .apply import load_api_client

ATTEMPT_SECONDS = 5.0
RETRY_PAUSE_SECONDS = 0.5
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


class NotConnected(Exception):
    """No credentials, or no answer from the API server in time; the message names the fix."""


def check_api_server(timeout: float) -> str:
    """The API server's address once ``GET /version`` answers; ``NotConnected`` when there are no
    credentials, the server rejects them, or it does not answer within ``timeout`` seconds."""
    try:
        api = load_api_client(pool_size=1, retries=0)
    except (k8s_config.ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        raise NotConnected(_no_credentials(exc)) from None
    host = api.configuration.host
    deadline = time.monotonic() + timeout
    last = "no answer"
    with api:
        while True:
            left = deadline - time.monotonic()
            try:
                k8s.VersionApi(api).get_code(_request_timeout=max(0.1, min(ATTEMPT_SECONDS, left)))
                return str(host)
            except k8s.ApiException as exc:
                if exc.status == 401:
                    raise NotConnected(
                        f"the API server at {host} rejected the kubeconfig's credentials (401 "
                        "Unauthorized); refresh them or pick another context"
                    ) from None
                if exc.status and exc.status < 500:
                    return str(host)  # it answered; authorization is kopf's and the RBAC's business
                last = f"HTTP {exc.status}"
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                last = _short(exc)
            if time.monotonic() + RETRY_PAUSE_SECONDS >= deadline:
                raise NotConnected(
                    f"the API server at {host} did not answer within {timeout:g}s ({last}); check the "
                    "kubeconfig's server and that the cluster is up, or raise --connect-timeout"
                )
            time.sleep(RETRY_PAUSE_SECONDS)


def _no_credentials(exc: BaseException) -> str:
    """Which kubeconfig was looked for (``KUBECONFIG``, else ``~/.kube/config``) and what was wrong."""
    where = k8s_config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    found = [p for p in where.split(os.pathsep) if p and Path(p).expanduser().exists()]
    if not found:
        return (
            f"no Kubernetes credentials: no kubeconfig at {where} and not in a pod with a service "
            "account; set KUBECONFIG to a kubeconfig file, or run in the cluster"
        )
    return (
        f"the kubeconfig {', '.join(found)} is unusable ({_short(exc)}); fix it or set KUBECONFIG to "
        "another"
    )


def _short(exc: BaseException) -> str:
    """An exception's cause in a few words: the OS error's text where one is inside, else the first line."""
    reason = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps the cause
    if isinstance(reason, BaseException):
        exc = reason
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "connected, but no response: read timed out"
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
        exc, urllib3.exceptions.NewConnectionError  # a subclass, for "connection refused" and the like
    ):
        return "connect timed out"
    text = str(exc)
    found = _ERRNO.search(text)
    if found:
        return found.group(1).strip()
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:160]
