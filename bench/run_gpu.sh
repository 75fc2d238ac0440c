#!/usr/bin/env bash
# One GPU machine run of the GPU tests and model benchmarks, split into tracks that can run side by
# side on a 2-GPU host (one track per GPU). Each step has its own time limit, so one failure costs
# only its step; every step's output goes to $OUT/<track>.log.
#
#   bash bench/run_gpu.sh tests          # GPU tests, then ResNet-50 and Gemma 4 decode
#   bash bench/run_gpu.sh models         # profiles of the LLM prefills, SD3.5 and Qwen3.5 decode
#   CUDA_VISIBLE_DEVICES=1 bash bench/run_gpu.sh models
set -u
track=${1:?name a track: tests or models}
out=${OUT:-bench-out}
mkdir -p "$out"
log="$out/$track.log"
export PYTHONUNBUFFERED=1
step() {  # step SECONDS COMMAND...: run with a time limit, log it, keep going on failure
    local limit=$1; shift
    echo "=== $(date +%T) [$limit s] $*" | tee -a "$log"
    timeout --signal=INT --kill-after=20 "$limit" "$@" >>"$log" 2>&1
    echo "=== rc=$? after $SECONDS s" | tee -a "$log"
}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader >>"$log"
case $track in
  tests)
    step 170 python3 -m pytest -m gpu -q -p no:cacheprovider -x --timeout 120 \
        tests/propose tests/capture tests/integrate
    step 160 python3 bench/bench_models.py resnet50 --out "$out" --cuda-graphs
    step 170 python3 bench/bench_models.py gemma4 --mode decode --out "$out" --cuda-graphs
    ;;
  models)
    step 70 python3 -m kforge profile gemma4 --mode prefill --db "$out/prefill/g.db"
    step 200 python3 bench/bench_models.py sd35 --out "$out"
    step 220 python3 bench/bench_models.py qwen35 --mode decode --layers 8 --out "$out" --cuda-graphs
    ;;
  *) echo "unknown track $track" >&2; exit 2 ;;
esac
