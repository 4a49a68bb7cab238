"""The ``bench`` command group and the codec benchmark's report shapes (the timing itself needs the
sglang wheel and runs from the CLI, see docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import gc
import json

import numpy as np

from dataplane.commands import bench
from dataplane.harness.bench.codec import Result, Timing, fragmented_pages, make_inputs, rates, render


def test_bench_group_has_codec_subcommand() -> None:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "codec", "--json", "--iterations", "7"])
    assert (args.bench, args.json, args.iterations) == ("codec", True, 7)
    assert (args.rounds, args.cpu, args.no_pin, args.only) == (9, None, False, None)
    assert args.handler is bench._codec


def test_render_json_and_table() -> None:
    results = [Result("plan", 6000.0, 300.0), Result("frames", 100.0, 200.0)]
    assert json.loads(render(results, True)) == [
        {"scenario": "plan", "ours_per_s": 6000.0, "sglang_per_s": 300.0, "ratio": 20.0},
        {"scenario": "frames", "ours_per_s": 100.0, "sglang_per_s": 200.0, "ratio": 0.5},
    ]
    table = render(results, False)
    assert "machine:" in table and "python" in table and "20.0x" in table


def test_timing_reports_best_rounds_and_the_spread() -> None:
    """Rates are each side's best round; the spread is the per-round ratios (adjacent batches)."""
    timing = Timing(ours=(1e-4, 2e-4, 1e-4), theirs=(1e-3, 1e-3, 3e-3))
    got = timing.result("request", cpu=1, planner="numpy").as_dict()
    assert got["ours_per_s"] == 10_000.0 and got["sglang_per_s"] == 1_000.0 and got["ratio"] == 10.0
    assert (got["rounds"], got["ratio_min"], got["ratio_median"], got["ratio_max"]) == (3, 5.0, 10.0, 30.0)
    assert got["ours_median_per_s"] == 10_000.0 and got["sglang_median_per_s"] == 1_000.0
    assert (got["cpu"], got["planner"]) == (1, "numpy")
    table = render([timing.result("request", cpu=1)], False)
    assert "pinned to CPU 1" in table and "5.0 / 10.0 / 30.0" in table


def test_rates_alternate_and_switch_the_collector_off() -> None:
    """Every round times both sides once, in alternating order, with the garbage collector off."""
    calls: list[tuple[str, bool]] = []
    rates(
        lambda: calls.append(("ours", gc.isenabled())),
        lambda: calls.append(("theirs", gc.isenabled())),
        iterations=2,
        budget_s=0.0,
        rounds=4,
    )
    timed = calls[-8:]  # 4 rounds x 2 sides x 1 call (no time budget), after the warm-ups
    assert [side for side, _ in timed] == ["ours", "theirs", "theirs", "ours"] * 2
    assert not any(enabled for _, enabled in timed)
    assert gc.isenabled()


def test_scenario_inputs_are_fragmented_runs_of_1_to_16() -> None:
    pages = fragmented_pages(np.random.default_rng(1), 512, 4096)
    assert pages.size == 512 == np.unique(pages).size
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    runs = np.diff(np.concatenate(([0], breaks, [pages.size])))
    assert runs.max() <= 16 and len(runs) > 512 // 16
    inp = make_inputs()
    assert len(inp.local.kv.layer_ids) == 24 and len(inp.local.components[0].tensors) == 72
