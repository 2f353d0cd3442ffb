"""Published vLLM start-up logs (data/published_vllm.yaml) against calc.serve: every logged figure within 3 %
where the log's settings are known; the logs with a named miss keep failing by more than that until the
checkpoint format they use is modelled (an honest record, not a pass)."""

from __future__ import annotations

import pytest

from calc.serve.published import compare, published_logs

LOGS = published_logs()
TOLERANCE = 0.03


def test_the_data_names_a_source_and_a_version_for_every_log():
    assert len(LOGS) >= 8
    assert len({log.id for log in LOGS}) == len(LOGS)
    for log in LOGS:
        assert log.source.startswith("https://") and log.vllm_version and log.gpu


@pytest.mark.parametrize("log", [log for log in LOGS if log.known_miss is None], ids=lambda log: log.id)
def test_logged_figures_within_3_percent(log):
    rows = compare(log)
    assert rows, "a log with nothing to compare"
    for row in rows:
        assert abs(row.error) <= TOLERANCE, f"{row.figure}: logged {row.logged}, predicted {row.predicted}"


@pytest.mark.parametrize("log", [log for log in LOGS if log.known_miss], ids=lambda log: log.id)
def test_named_misses_are_still_misses_in_the_weights_only(log):
    rows = {row.figure: row for row in compare(log)}
    assert abs(rows["weights_gib"].error) > TOLERANCE  # the checkpoint format the note names is not modelled
    assert all(abs(r.error) <= TOLERANCE for name, r in rows.items() if name != "weights_gib")
