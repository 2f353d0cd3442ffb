"""The product's promise: predictions within 3 % median and 8 % worst of measured peaks.

Runs the engine against every committed measurement (data/*.jsonl, produced by
`python -m measure` / `python -m measure.suite`) and checks the thresholds overall, per group and,
where the measurement reports categories, per component at the peak.
"""

from __future__ import annotations

import statistics

import pytest

from calc.evidence.validate import default_data_files, load_all, report

MEDIAN_PCT, WORST_PCT = 3.0, 8.0


@pytest.fixture(scope="module")
def rep():
    files = default_data_files()
    assert files, "no committed measurement data under data/"
    return report(load_all(files))


def test_data_set_is_large_and_varied(rep):
    assert len(rep.cases) >= 80
    families = {c.family for c in rep.cases}
    assert {"llama", "gpt2"} <= families and len(families) >= 3
    assert {"fp32", "amp-bf16", "bf16"} <= {c.precision for c in rep.cases}
    assert {"eager", "sdpa"} <= {c.attention for c in rep.cases}
    assert {"train", "inference"} <= {c.mode for c in rep.cases}


def test_peak_allocated_within_contract(rep):
    worst = max(rep.cases, key=lambda c: abs(c.error_pct))
    assert rep.median_abs_error_pct <= MEDIAN_PCT
    assert rep.worst_abs_error_pct <= WORST_PCT, f"worst case {worst.name}: {worst.error_pct:+.2f} %"


def test_every_group_within_worst_bound(rep):
    bad = [g for g in rep.groups if g.worst_abs_error_pct > WORST_PCT]
    assert not bad, bad


def test_components_at_peak_within_contract(rep):
    errs = [abs(e) for c in rep.cases for e in c.component_errors_pct.values()]
    assert errs, "no record with per-category bytes at an optimizer-step peak"
    assert statistics.median(errs) <= MEDIAN_PCT
    assert max(errs) <= WORST_PCT
