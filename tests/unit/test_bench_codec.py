"""The ``bench`` command group and the codec benchmark's report shapes (the timing itself needs the
sglang wheel and runs from the CLI, see docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import json

import numpy as np

from dataplane.bench.codec import Result, fragmented_pages, make_inputs, render
from dataplane.commands import bench


def test_bench_group_has_codec_subcommand() -> None:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "codec", "--json", "--iterations", "7"])
    assert (args.bench, args.json, args.iterations) == ("codec", True, 7)
    assert args.handler is bench._codec


def test_render_json_and_table() -> None:
    results = [Result("plan", 6000.0, 300.0), Result("frames", 100.0, 200.0)]
    assert json.loads(render(results, True)) == [
        {"scenario": "plan", "ours_per_s": 6000.0, "sglang_per_s": 300.0, "ratio": 20.0},
        {"scenario": "frames", "ours_per_s": 100.0, "sglang_per_s": 200.0, "ratio": 0.5},
    ]
    table = render(results, False)
    assert "machine:" in table and "python" in table and "20.0x" in table


def test_scenario_inputs_are_fragmented_runs_of_1_to_16() -> None:
    pages = fragmented_pages(np.random.default_rng(1), 512, 4096)
    assert pages.size == 512 == np.unique(pages).size
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    runs = np.diff(np.concatenate(([0], breaks, [pages.size])))
    assert runs.max() <= 16 and len(runs) > 512 // 16
    inp = make_inputs()
    assert len(inp.local.kv.layer_ids) == 24 and len(inp.local.components[0].tensors) == 72
