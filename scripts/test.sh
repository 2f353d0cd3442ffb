#!/usr/bin/env bash
# Install the dev requirements (torch CPU build pinned, a system Chromium for the browser test)
# and run the whole test suite. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements-dev.txt -r measure/requirements-frameworks.txt
# LitGPT apart, without its dependencies: it pins huggingface-hub<1.4, which transformers 5.23 cannot use
# (measure/requirements-litgpt.txt says why; its model code runs with the hub transformers brings).
python3 -m pip install -q --no-deps -r measure/requirements-litgpt.txt
# The torchao the exported torchtune bundles pin, apart (peft refuses it in the shared environment): only the
# `tune run` test puts build/torchtune-bundle first on its path (measure/requirements-torchtune-bundle.txt says why).
python3 -m pip install -q --no-deps --upgrade --target build/torchtune-bundle -r measure/requirements-torchtune-bundle.txt
if ! command -v chromium >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium; browser test will be skipped"
fi
# The browser test screenshots the Chinese pages: without a CJK font Chromium draws boxes.
if command -v chromium >/dev/null 2>&1 && ! fc-list :lang=zh 2>/dev/null | grep -q .; then
  (apt-get update -qq && apt-get install -y -qq fonts-noto-cjk >/dev/null) || echo "warning: could not install fonts-noto-cjk; Chinese screenshots will show boxes"
fi
python3 -m ruff check .
python3 -m pytest -q "$@"
