#!/usr/bin/env bash
# The checks that need a GPU, in one short script (≤ 8 minutes on one H100): the engine and the core
# with CUDA tensors — W=1 over NCCL and W=2 over Gloo with both ranks on one GPU — then the engine's
# paired speed check on CUDA (CUDA events). Run from the repository root on a machine with torch (CUDA
# build), pytest and this package's dependencies; nothing is downloaded. Prints what it ran and each
# step's exit status; exits non-zero if any step failed.
#
#     bash scripts/device_check.sh            # PYTHON=/path/to/python to pick the interpreter
set -uo pipefail
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0
step() {  # step <seconds> <label> <command...>
    local limit=$1 label=$2; shift 2
    echo "== $label"
    local start=$SECONDS
    timeout "$limit" "$@"; local rc=$?
    echo "== $label: exit $rc in $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || failed=1
}

step 30 "device" "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
[ "$failed" -eq 0 ] || { echo "no usable CUDA device: stopping"; exit 1; }
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv 2>/dev/null || true

# The engine with CUDA tensors: W=1 NCCL, W=2 Gloo on one GPU; the step with CUDA's sync check set to
# raise, and a collective's span timed with CUDA events (tests/dist/test_engine_cuda.py: three worlds).
step 180 "engine, CUDA tensors (W=1 nccl, W=2 gloo; no host sync, CUDA-event timing)" "$PY" -m pytest -q -n 0 \
    -p no:cacheprovider -m cuda tests/dist/test_engine_cuda.py
# The core's single-rank layer, the engine's unit layer and the timing's CPU path (CPU; they must still pass there).
step 120 "core + engine unit layer" "$PY" -m pytest -q -n 0 -p no:cacheprovider \
    tests/unit/test_engine_layout.py tests/unit/test_exchange_single_rank.py tests/unit/test_partition.py \
    tests/unit/test_comm_stats.py
# The quick benchmark of the engine on CUDA: W=1 NCCL, then W=2 Gloo on one GPU.
step 90 "speed, W=1 nccl" "$PY" scripts/bench_engine_speed.py --device cuda --world 1 --rounds 10 --warmup 3
step 90 "speed, W=2 gloo (one GPU)" "$PY" scripts/bench_engine_speed.py --device cuda --world 2 --rounds 10 --warmup 3
echo "device_check: $([ "$failed" -eq 0 ] && echo all passed || echo FAILED)"
exit "$failed"
