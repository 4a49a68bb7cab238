"""A real Prometheus server (Debian's ``prometheus``) for tests: started on 127.0.0.1 with a generated
config and a temporary TSDB, bounded waits, always stopped; plus helpers that turn a Grafana panel's
query into the PromQL Grafana would send (variables and ``$__rate_interval`` substituted)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from dataplane.harness.agent_processes import free_port
from dataplane.harness.waiting import wait_for

SCRAPE_INTERVAL_S = 1
RATE_INTERVAL = "10s"
"""What Grafana computes for $__rate_interval here: at least four scrape intervals, and a little more."""
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Prometheus:
    """A running server; ``query_range`` returns Prometheus' ``result`` list."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path):
        self.url, self.proc, self.log = url, proc, log

    def api(self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, Any]]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with _NO_PROXY.open(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"prometheus {path} {dict(params)}: {exc.code} {exc.read()!r}") from exc
        assert body["status"] == "success", body
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        params = {"query": expr, "start": start, "end": end, "step": step}
        return list(self.api("query_range", params)["result"])

    def label_values(self, selector: str, label: str, start: float, end: float) -> list[str]:
        series = self.api("series", [("match[]", selector), ("start", start), ("end", end)])
        return sorted({s[label] for s in series if label in s})

    def targets_up(self) -> dict[str, str]:
        active = self.api("targets", {"state": "active"})["activeTargets"]
        return {t["scrapeUrl"]: t["health"] for t in active}

    def wait_until(self, what: str, check: Any, timeout: float = 60) -> None:
        """``wait_for`` ``check``, failing at once if Prometheus exits."""
        wait_for(what, lambda: self.running() and check(), timeout=timeout, interval=0.5)

    def running(self) -> bool:
        if self.proc.poll() is not None:
            tail = self.log.read_text()[-2000:]
            raise AssertionError(f"prometheus exited ({self.proc.returncode}): {tail}")
        return True


def _ready(url: str) -> bool:
    try:
        with _NO_PROXY.open(f"{url}/-/ready", timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


@contextmanager
def prometheus(workdir: Path, jobs: Mapping[str, Sequence[str]], timeout: float = 60) -> Iterator[Prometheus]:
    """Run Prometheus scraping ``jobs`` (job name → ``host:port`` targets) every second."""
    exe = shutil.which("prometheus")
    assert exe, "Debian's prometheus is missing: run hack/ci-prometheus.sh"
    config = {"global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": "5s"},
              "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}
                                 for job, targets in jobs.items()]}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address={url.removeprefix('http://')}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Prometheus(url, proc, log)
    try:
        server.wait_until("prometheus /-/ready", lambda: _ready(url), timeout)
        yield server
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def substitute(expr: str, values: Mapping[str, Sequence[str]]) -> str:
    """Grafana's interpolation for Prometheus: a multi-value variable inside ``=~"..."`` becomes
    ``(a|b)`` with regex metacharacters escaped (a backslash doubled inside the PromQL string);
    ``$__rate_interval`` becomes the rate window."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name in sorted(values, key=len, reverse=True):
        escaped = [re.escape(v).replace("\\", "\\\\") for v in values[name]]
        out = out.replace(f"${name}", "(" + "|".join(escaped) + ")" if escaped else "")
    assert "$" not in out, f"unsubstituted variable in {out}"
    return out


def resolve_variables(prom: Prometheus, board: Mapping[str, Any], start: float, end: float,
                      ) -> dict[str, list[str]]:
    """Each ``label_values()`` variable's values, in order (later ones may use earlier ones)."""
    values: dict[str, list[str]] = {}
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = LABEL_VALUES.match(var["query"]["query"])
        assert match, f"variable {var['name']} is not label_values(): {var['query']}"
        selector = substitute(match.group("selector"), values)
        values[var["name"]] = prom.label_values(selector, match.group("label"), start, end)
    return values


def save_panel_data(uid: str, panel: Mapping[str, Any], results: list[Any], start: float) -> None:
    """With PDPAIR_DASHBOARD_DATA=DIR, append one panel's query results to DIR/<uid>.jsonl."""
    directory = os.environ.get("PDPAIR_DASHBOARD_DATA")
    if not directory:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    record = {"title": panel["title"], "unit": panel["fieldConfig"]["defaults"]["unit"], "id": panel["id"],
              "legends": [t["legendFormat"] for t in panel["targets"]], "results": results, "start": start}
    with (Path(directory) / f"{uid}.jsonl").open("a") as fh:
        fh.write(json.dumps(record) + "\n")
