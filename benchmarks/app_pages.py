"""How long a page rerun takes after a widget change, measured with Streamlit's AppTest (the script run
a browser would trigger, without the network and the browser's rendering).

    PYTHONPATH=. python benchmarks/app_pages.py [--repeats 12] [--budget-ms 300]

For every page: open it once (cold: imports, preset loading, the model x hardware table on Recommend),
then change one widget to a value not seen before (so every cached search misses) `repeats` times and
time each at.run(). Prints the first run's wall and CPU time (time.process_time: what the script cost,
whatever else the machine runs), median / 90th percentile / max per page, and exits 1 if any median is
over the budget.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# page -> (page script or None for app.py, widget key, values to cycle through: each one new)
CASES = {
    "Calculator": (None, "sc_mbs", list(range(2, 40))),
    "Calculator (ZeRO stage)": (None, "sc_zero", [1, 2, 3, 0] * 10),
    "Compare": ("pages/2_Compare.py", "sc_mbs", list(range(2, 40))),
    "Recommend": ("pages/3_Recommend.py", "sc_seq", [512 * k for k in range(1, 40)]),
    "Explain": ("pages/4_Explain.py", "sc_seq", [512 * k for k in range(1, 40)]),
    "Export": ("pages/5_Export.py", "sc_mbs", list(range(2, 40))),
    "Validation": ("pages/6_Validation.py", "sc_ga", list(range(2, 40))),
}


def _widget(at: AppTest, key: str):
    for kind in ("selectbox", "number_input", "radio", "checkbox", "toggle", "text_area"):
        for w in getattr(at, kind):
            if w.key == key:
                return w
    raise KeyError(key)


def bench(page: str | None, key: str, values: list, repeats: int) -> tuple[float, float, list[float]]:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    if page:
        at.switch_page(page)
    t0, c0 = time.perf_counter(), time.process_time()
    at.run()
    cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    if at.exception:
        raise SystemExit(f"{page or 'app.py'}: exception on first run")
    times = []
    for v in values[:repeats]:
        _widget(at, key).set_value(v)
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
        if at.exception:
            raise SystemExit(f"{page or 'app.py'}: exception after {key}={v!r}")
    return cold, cold_cpu, times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--budget-ms", type=float, default=300.0)
    args = ap.parse_args()
    print(f"{'page':26s} {'widget':12s} {'first run ms':>12s} {'(CPU ms)':>9s} {'median ms':>10s} {'p90 ms':>8s} "
          f"{'max ms':>8s}")
    worst = 0.0
    for name, (page, key, values) in CASES.items():
        cold, cold_cpu, times = bench(page, key, values, args.repeats)
        times.sort()
        med = statistics.median(times) * 1e3
        p90 = times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3
        worst = max(worst, med)
        print(f"{name:26s} {key:12s} {cold * 1e3:12.0f} {cold_cpu * 1e3:9.0f} {med:10.0f} {p90:8.0f} "
              f"{max(times) * 1e3:8.0f}")
    ok = worst <= args.budget_ms
    print(f"\nslowest median rerun {worst:.0f} ms; budget {args.budget_ms:.0f} ms: {'OK' if ok else 'OVER'} "
          "(AppTest script time on this machine; each change uses a new value, so cached searches miss)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
