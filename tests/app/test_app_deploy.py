"""Hosting: requirements.txt alone runs the app. Every page is run (AppTest, in a fresh interpreter) and
every third-party module it imports must come from requirements.txt or their dependencies; torch,
transformers and playwright must not be imported at all. One navigation mechanism: pages/ auto-discovery,
no st.navigation."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUN_ALL_PAGES = r"""
import json, sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1] + "/app.py", default_timeout=600)
at.run()
assert not at.exception
for page in ("pages/2_Compare.py", "pages/3_Recommend.py", "pages/4_Explain.py", "pages/5_Export.py",
             "pages/6_Validation.py"):
    at.switch_page(page)
    at.run()
    if at.session_state["vc_first_screen"]:  # stopped after its first screen: the browser reruns it (ui.first_screen)
        at.run()
    assert not at.exception, page
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def _requirement_closure() -> set[str]:
    names = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.append(re.split(r"[<>=!~\[; ]", line)[0])
    seen: set[str] = set()
    while names:
        n = names.pop().lower().replace("_", "-")
        if n in seen:
            continue
        seen.add(n)
        try:
            reqs = metadata.requires(n) or []
        except metadata.PackageNotFoundError:
            continue
        for r in reqs:
            if "extra ==" in r:
                continue
            names.append(re.split(r"[<>=!~\[; (]", r)[0])
    return seen


def _modules(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


# modules an installed package imports only when they are there (the measurement frameworks bring them), each
# with the package that runs without it
OPTIONAL_IMPORTS = {"sniffio": "anyio (_core/_eventloop.py: `try: import sniffio` ... `sniffio = None`)"}


def test_pages_import_only_what_requirements_install():
    startup = _modules("import json, sys; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    modules = _modules(RUN_ALL_PAGES) - startup  # .pth hooks of the interpreter are not the app's
    assert not modules & {"torch", "transformers", "playwright", "peft", "bitsandbytes"}
    allowed = _requirement_closure()
    dist_of = metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    local = {"calc", "ui", "measure", "pages", "app", "__main__"}
    foreign = []
    for m in sorted(modules - stdlib - local - set(OPTIONAL_IMPORTS)):
        dists = {d.lower().replace("_", "-") for d in dist_of.get(m, [])}
        if dists and not dists & allowed:
            foreign.append((m, sorted(dists)))
    assert not foreign, f"imported by the app but not installed by requirements.txt: {foreign}"


def test_one_navigation_mechanism():
    sources = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py")), *sorted((ROOT / "ui").glob("*.py"))]
    for path in sources:
        assert "st.navigation(" not in path.read_text(), path
    assert (ROOT / "pages").is_dir()
    config = (ROOT / ".streamlit" / "config.toml").read_text()
    assert 'showErrorDetails = "none"' in config  # a traceback never reaches a hosted page
