#!/usr/bin/env bash
# Measure the suite on the GPU of this machine and append the records to data/measured_cuda.jsonl.
#
#   bash measure/run_gpu.sh [--install] [extra args for python -m measure.suite, e.g. --only NAME ...]
#
# Runs every suite entry meant for cuda (python -m measure.suite --device cuda --list): the small
# scenarios that the CPU data set also has, the 0.5B-8B presets that fit one large GPU, and a few
# GPU-only ones (llama-3.2-1b bf16 AdamW 4 x 2048, 8B inference, QLoRA nf4 and 8-bit AdamW when
# bitsandbytes is installed). One GPU is used (CUDA_VISIBLE_DEVICES picks it). Entries the device
# cannot run (out of memory, no bitsandbytes) are reported and skipped; the rest go on.
# --install: pip install -r measure/requirements.txt first (torch 2.13.0 from PyPI is a CUDA build).
# RECORDS names the records file (default data/measured_cuda.jsonl; not OUT, which names a folder on some GPU
# hosts); packages on PYTHONPATH stay visible. Building the presets takes seconds each on the GPU: the whole
# suite is some minutes on an H200, the small entries under a second each.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
RECORDS="${RECORDS:-data/measured_cuda.jsonl}"

if [[ "${1:-}" == "--install" ]]; then
  shift
  "$PYTHON" -m pip install -q -r measure/requirements.txt
fi

"$PYTHON" - <<'EOF'
import sys
try:
    import torch
except ImportError:
    sys.exit("error: torch is not installed; run: bash measure/run_gpu.sh --install")
if not torch.cuda.is_available():
    sys.exit(f"error: torch {torch.__version__} sees no CUDA device (a CPU-only build, or no driver)")
p = torch.cuda.get_device_properties(0)
print(f"measuring on {p.name}, {p.total_memory / 2**30:.1f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}",
      file=sys.stderr)
EOF

mkdir -p "$(dirname "$RECORDS")"
before=$( [[ -f "$RECORDS" ]] && wc -l < "$RECORDS" || echo 0 )
start=$(date +%s)
status=0
PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m measure.suite --device cuda -o "$RECORDS" "$@" || status=$?
after=$(wc -l < "$RECORDS" 2>/dev/null || echo 0)
echo "appended $((after - before)) records to $RECORDS in $(( $(date +%s) - start )) s (suite exit code $status)" >&2
exit "$status"
