"""bench/timing_trust.py's figures read from a run's files (the GPU run itself is `make
timing-trust`): how each row's timed calls spread, and how far two copies' medians may fall
apart by chance alone."""

from __future__ import annotations

import importlib.util
import json
import random
import sys

import pytest

from grader.common import config

TRUST = config.REPO_ROOT / "bench" / "timing_trust.py"
spec = importlib.util.spec_from_file_location("timing_trust", TRUST)
timing_trust = sys.modules.setdefault("timing_trust", importlib.util.module_from_spec(spec))
spec.loader.exec_module(timing_trust)


def test_a_loop_that_slows_through_its_calls_shows_a_drift_and_follows_itself():
    times = [13.0 + 0.01 * i for i in range(100)]          # 13.00 ms rising to 13.99 ms
    f = timing_trust.series_figures(dict(times_ms=times, events_ms=[t - 0.8 for t in times]))
    assert f["n"] == 100
    assert f["drift"] == pytest.approx(13.945 / 13.045 - 1)
    assert f["events_drift"] == pytest.approx(13.145 / 12.245 - 1)
    assert f["halves"] == pytest.approx(13.745 / 13.245 - 1)
    assert f["lag1"] > 0.9
    assert f["tail"] == 0.0                  # none over 1.05 x the median, 13.495
    assert f["p10_ms"] == pytest.approx(13.10) and f["p90_ms"] == pytest.approx(13.90)


def test_independent_calls_show_no_drift_and_no_lag():
    rng = random.Random(7)
    times = [rng.gauss(13.0, 0.5) for _ in range(400)]
    f = timing_trust.series_figures(dict(times_ms=times, events_ms=[]))
    assert abs(f["lag1"]) < 0.15
    assert abs(f["halves"]) < 0.01
    assert f["events_drift"] == 0.0
    assert f["times_ms"] == [round(t, 4) for t in times]


def test_a_slow_tail_is_the_share_of_calls_past_five_percent_over_the_median():
    times = [13.0] * 95 + [14.0] * 5            # 14.0 > 1.05 x 13.0
    f = timing_trust.series_figures(dict(times_ms=times, events_ms=[]))
    assert f["tail"] == pytest.approx(0.05) and f["median_ms"] == 13.0


def test_too_few_calls_say_nothing_rather_than_something_false():
    f = timing_trust.series_figures(dict(times_ms=[13.0] * 5, events_ms=[12.0] * 5))
    assert f["n"] == 5 and f["drift"] == 0.0 and f["lag1"] == 0.0 and f["median_ms"] == 0.0


def test_the_chance_spread_comes_from_the_medians_intervals():
    # half-widths 0.196 and 0.098 ms on a 13 ms median: standard errors 0.1 and 0.05 ms
    a = dict(median_ms=13.0, median_low_ms=12.804, median_high_ms=13.196)
    b = dict(median_ms=13.0, median_low_ms=12.902, median_high_ms=13.098)
    assert timing_trust.chance_spread(a, b) == pytest.approx((0.1 ** 2 + 0.05 ** 2) ** 0.5 / 13.0)
    assert timing_trust.chance_spread(a, dict(median_ms=13.0)) == pytest.approx(0.1 / 13.0)


def test_each_rows_calls_are_read_from_the_runs_logs(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "same_kernel_a.time.calls.json").write_text(json.dumps(dict(times_ms=[1.0], events_ms=[0.9])))
    (logs / "sdpa_flash.gpu0.time.calls.json").write_text(json.dumps(dict(times_ms=[2.0], events_ms=[1.9])))
    (logs / "same_kernel_a.time.log").write_text("not the calls")
    rows = {"same_kernel_a": 1.0, "same_kernel_b": 1.0, "sdpa_flash (baseline row)": 2.0}
    series = timing_trust.call_series(tmp_path, rows)
    assert series == {"same_kernel_a": dict(times_ms=[1.0], events_ms=[0.9]),
                      "sdpa_flash (baseline row)": dict(times_ms=[2.0], events_ms=[1.9])}


PROBE = config.REPO_ROOT / "bench" / "placement_probe.py"
probe_spec = importlib.util.spec_from_file_location("placement_probe", PROBE)
placement_probe = sys.modules.setdefault("placement_probe", importlib.util.module_from_spec(probe_spec))
probe_spec.loader.exec_module(placement_probe)


def _noisy(rng: random.Random, centre: float, n: int = 100) -> list[float]:
    return [rng.gauss(centre, 0.05 * centre) for _ in range(n)]


def test_the_placement_probe_tells_a_slow_placement_from_chance():
    rng = random.Random(3)
    # every process: three sets at 13 ms and one 5% slower; the processes themselves alike
    processes = [dict(placements=[_noisy(rng, 13.0), _noisy(rng, 13.0), _noisy(rng, 13.0), _noisy(rng, 13.65)])
                 for _ in range(4)]
    f = placement_probe.figures(processes)
    assert f["within_process"]["spread"] > 3 * f["within_process"]["chance"]
    assert f["between_processes"]["spread"] < 2 * f["between_processes"]["chance"]


def test_the_placement_probe_tells_a_slow_process_from_chance():
    rng = random.Random(4)
    # within a process the sets are alike; the processes' own speeds differ by up to 4%
    processes = [dict(placements=[_noisy(rng, centre) for _ in range(4)])
                 for centre in (13.0, 13.52, 13.2, 12.9)]
    f = placement_probe.figures(processes)
    assert f["between_processes"]["spread"] > 3 * f["between_processes"]["chance"]
    assert f["within_process"]["spread"] < 2 * f["within_process"]["chance"]
    assert len(f["set_medians_ms"]) == 4 and len(f["set_medians_ms"][0]) == 4


def test_the_placement_probe_reports_each_idle_gap_over_every_process():
    rng = random.Random(5)
    # the kernel 6% slower with no idle before it than after 10 ms of idle
    processes = [dict(placements=[_noisy(rng, 13.0)] * 2,
                      gaps={"0.0": _noisy(rng, 13.78), "10.0": _noisy(rng, 13.0)}) for _ in range(3)]
    f = placement_probe.figures(processes)
    assert set(f["gaps"]) == {"0.0", "10.0"}
    assert f["gaps"]["0.0"]["median_ms"] / f["gaps"]["10.0"]["median_ms"] == pytest.approx(1.06, abs=0.01)
    assert len(f["gaps"]["10.0"]["process_medians_ms"]) == 3
    assert f["gaps"]["10.0"]["spread"] == pytest.approx(0.05, abs=0.01)
    assert placement_probe.figures([dict(placements=[[13.0] * 30] * 2)])["gaps"] == {}


def test_the_placement_probe_takes_its_keys_in_blocks_their_order_rotated_each_round():
    order: list = []
    times = placement_probe.interleaved(["a", "b", "c"], 5, 2, lambda k: order.append(k) or 1.0)
    # rounds: a a b b c c | b b c c a a | c a b (each key's last block cut to its 5 calls)
    assert order == list("aabbcc") + list("bbccaa") + list("cab")
    assert {k: len(v) for k, v in times.items()} == {"a": 5, "b": 5, "c": 5}
    assert placement_probe.interleaved([], 5, 2, lambda k: 1.0) == {}
