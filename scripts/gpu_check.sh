#!/usr/bin/env bash
# One short check of RLHFless on a GPU machine (issue 17), in four parts:
#   (a) the CUDA tests (pytest -m cuda: device placement, CPU/CUDA sample identity, noise bits,
#       CUDA graphs, the learner's determinism);
#   (b) GRPO steps of a random-weight Qwen2.5-0.5B-shaped model on the GPU under the `verl` and
#       `rlhfless` policies (Ray executor), and rlhfless without CUDA graphs, printing step time
#       and cost of each and their samples against verl's, step by step;
#   (c) sample identity between CPU and CUDA decode functions, a sequence migrated CPU -> CUDA
#       mid-decode included;
#   (d) a decode step's time, eager and as CUDA graphs (benchmarks/gpu_check.py does (b)-(d)).
#
# Written on a machine with no GPU, where its whole path runs on a CPU: DEVICE=cpu MODEL=tiny
# STEPS=2 scripts/gpu_check.sh (tests/runtime/test_gpu_check.py). On one lent H200 (session 29) it
# took about 5 minutes and every part passed: docs/MEASUREMENTS.md, "On one NVIDIA H200".
#
# Needs the project's dependencies importable by $PYTHON (ray, pydantic, reasoning-gym, ...);
# nothing is downloaded at run time (HF_HUB_OFFLINE=1). Usage:
#   scripts/gpu_check.sh                                   # DEVICE=cuda MODEL=qwen2.5-0.5b STEPS=3
#   DEVICE=cpu MODEL=tiny STEPS=2 scripts/gpu_check.sh     # the same path on a CPU, in minutes
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-qwen2.5-0.5b}
STEPS=${STEPS:-3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

"$PYTHON" - "$DEVICE" <<'PY'
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "ray", "pydantic", "reasoning_gym", "psutil", "yaml", "pytest")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check: missing Python packages: {', '.join(missing)} (install the project's dependencies)")
import torch
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("gpu_check: DEVICE=cuda but torch sees no CUDA device")
print(f"gpu_check: torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
PY

# A part that fails does not stop the next: one run on a lent machine reports every part.
failed=()
echo "== (a) CUDA tests"
start=$SECONDS
timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda tests/engine tests/runtime/test_device.py \
    || failed+=("(a) CUDA tests")
echo "(a) took $((SECONDS - start)) s"

echo "== (b) GRPO steps under verl and rlhfless, (c) CPU/$DEVICE sample identity, (d) decode steps"
start=$SECONDS
timeout 540 "$PYTHON" benchmarks/gpu_check.py --device "$DEVICE" --model "$MODEL" --steps "$STEPS" "$@" \
    || failed+=("(b-d) gpu_check.py")
echo "(b-d) took $((SECONDS - start)) s"
if ((${#failed[@]})); then
    echo "gpu_check.sh: FAILED: ${failed[*]}"
    exit 1
fi
echo "gpu_check.sh: every part passed"
