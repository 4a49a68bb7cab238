"""The fault matrix's rows: each test marked ``faults`` fills one ``FaultRow`` (the fault, how it was
injected, the bound it must meet, the worst it observed) and the row's outcome is the test's. With
``PDPAIR_FAULTS_REPORT=<file>`` (``scripts/faults``) the rows are appended there as JSON lines, and
``tests/faults_table.py`` renders them; in a plain ``make test`` they are only checked."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

REPORT_ENV = "PDPAIR_FAULTS_REPORT"


@dataclass
class FaultRow:
    fault: str
    injected: str
    bound: str
    observed: str = "not reached"
    outcome: str = "not run"

    def write(self) -> None:
        path = os.environ.get(REPORT_ENV)
        if path:
            with Path(path).open("a") as out:
                out.write(json.dumps(asdict(self)) + "\n")
