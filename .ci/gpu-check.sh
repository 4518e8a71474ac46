#!/usr/bin/env bash
# The checks that need a CUDA device, in one short run (not part of .ci/run: CI has no GPU).
# On a machine with a CUDA device and a CUDA build of torch, from the repository root:
#   bash .ci/gpu-check.sh            (PYTHON=... to pick the interpreter; OUT=dir for the JSON)
# 1. builds the compiled core in place; 2. runs the two test modules that hold every test
# needing CUDA (pinned staging, non_blocking copies fenced by events, the device block table);
# 3. times the device feed (host time per step, the goal "under 30 us at B = 256 on a GPU")
# and the attention metadata, and writes their figures as JSON.
set -euo pipefail
PYTHON=${PYTHON:-python3}
OUT=${OUT:-.}
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: torch sees no CUDA device')"
"$PYTHON" -c "import torch; print('gpu-check:', torch.__version__, torch.cuda.get_device_name(0))"
TOKCY_REQUIRE_EXTENSIONS=1 "$PYTHON" setup.py -q build_ext --inplace
"$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/test_executor_torch.py tests/test_device_table.py
"$PYTHON" -m tokcy bench --backend cython --scenario device_feed --scenario attention --quick \
    --json "$OUT/gpu-bench.json"
