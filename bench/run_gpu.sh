#!/usr/bin/env bash
# One GPU machine run of the GPU tests and model benchmarks, split into tracks that can run side by
# side on a 2-GPU host (one track per GPU). Each step has its own time limit, so one failure costs
# only its step; every step's output goes to $OUT/<track>.log.
#
#   bash bench/run_gpu.sh tests          # GPU tests of integration and the library, ResNet-50 and
#                                        # Gemma 4 decode
#   bash bench/run_gpu.sh models         # SD3.5, Qwen3.5 decode (8 layers), Qwen3.5 prefill profile
#   bash bench/run_gpu.sh verify         # the evaluator's GPU red-team suite (compute-sanitizer
#                                        # included) and the native guard's GPU tests
#   GPUTESTS_PART=eval bash bench/run_gpu.sh gputests     # the GPU tests of tests/eval and
#                                        # tests/capture; =library-a, =library-b: tests/propose's
#   bash bench/run_gpu.sh host           # the evaluator's turnaround, the launch path's host cost
#   OLD=path/to/old/tree bash bench/run_gpu.sh library   # the library's kernels under this
#                                        # evaluator and under the one in OLD, side by side
#   bash bench/run_gpu.sh wholemodel     # every mode +/- kforge and the compiled modes' A/A
#                                        # controls, device time: the UNet-style model and the
#                                        # Llama-shaped prefill (4 layers); with max-autotune
#                                        # ~9 min a model (WHOLEMODEL_MODELS=unet, one a call)
#   bash bench/run_gpu.sh fault          # the UNet run that faulted cold, every launch synchronous
#   bash bench/run_gpu.sh regions        # region kernels one by one vs eager and compiled chains
#   bash bench/run_gpu.sh integration    # GPU tests of the compile backend, regions, matmuls,
#                                        # the new library families and the hardware counters
#   bash bench/run_gpu.sh timing         # the held-stream timer's GPU tests; per searched card of
#                                        # UNet and Llama (after wholemodel: its databases and
#                                        # projections) and Gemma 4 decode, profile vs eager
#                                        # device/host/wall time
#   bash bench/run_gpu.sh generate       # tokens/s of Gemma 4 and Qwen3.5 (8 layers), 256 new
#                                        # tokens after 2048, batch 1 and 8, static KV cache:
#                                        # eager, CUDA graphs, reduce-overhead, each +/- kforge
#   bash bench/run_gpu.sh sanitizer      # where a confirmation's compute-sanitizer time goes
#   bash bench/run_gpu.sh throughput     # library searches of the Llama-shaped prefill and the
#                                        # UNet-style model, 6 ops x 16 iterations: evaluations a
#                                        # minute, confirmation latency, time to the last
#                                        # confirmed winner
#   bash bench/run_gpu.sh mainjob        # the README's main job (Gemma 4 decode, top 8 ops) to
#                                        # its end: wall time, evaluations a minute, winners
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
work=${WORK:-/tmp/kforge-bench}  # workspaces (databases, samples) stay out of $out
bench_models=(python3 bench/bench_models.py --out "$out" --work "$work")
# whole-model runs: the A/A rows, the top 4 ops searched 6 iterations each, 10 timed reps a mode;
# WHOLEMODEL_REUSE=1 reuses a model's searched database under $WORK/e2e (no new profile or
# search: about 90 s less a model)
bench_e2e=(python3 bench/bench_e2e.py --aa --top 4 --iterations 6 --reps 10 --work "$work/e2e"
           ${WHOLEMODEL_REUSE:+--reuse})
case $track in
  tests)
    step 100 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 90 -rf \
        tests/integrate/test_gpu.py tests/propose/test_library_gpu.py -k "half_to_float or not test_every_variant"
    step 200 "${bench_models[@]}" resnet50 --cuda-graphs
    step 220 "${bench_models[@]}" gemma4 --mode decode --cuda-graphs
    ;;
  models)
    step 220 "${bench_models[@]}" sd35 --no-best-of-n --no-compile --reps 10
    step 220 "${bench_models[@]}" qwen35 --mode decode --layers 8 --cuda-graphs
    step 60 python3 -m kforge profile qwen35 --mode prefill --layers 8 --samples 0 \
        --db "$work/prefill.db"
    ;;
  gputests)  # every GPU test outside integration, in three calls: GPUTESTS_PART=eval (the red
    # team, the controls, timing, counters, capture), =library-a (the library's variants in float32
    # and float16, a step each) or =library-b (bfloat16, and its matmul and region families)
    case ${GPUTESTS_PART:-eval} in
      eval)
        step 560 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 120 -rf \
            tests/eval tests/capture ;;
      library-a)  # 104 cards a dtype, about 250 s each on an H100
        for dtype in float32 "float16 and not bfloat16"; do
          step 285 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 90 -rf \
              tests/propose/test_library_gpu.py -k "$dtype"
        done ;;
      library-b)
        step 285 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 90 -rf \
            tests/propose/test_library_gpu.py -k bfloat16
        step 285 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 90 -rf \
            tests/propose/test_matmul_gpu.py tests/propose/test_region_families_gpu.py ;;
      *) echo "unknown GPUTESTS_PART ${GPUTESTS_PART}: eval, library-a or library-b" >&2
         exit 2 ;;
    esac
    ;;
  verify)
    step 400 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 120 -rA tests/eval/test_gpu.py
    step 150 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 120 -rf \
        tests/integrate/test_native_gpu.py tests/integrate/test_gpu.py
    ;;
  host)
    step 60 python3 bench/bench_guard.py --host-only
    step 120 python3 bench/bench_evaluator.py --no-load-inline --reps 3 --budget-s 100
    ;;
  library)
    step 200 python3 bench/bench_library.py --no-compile --refine 1
    [ -n "${OLD:-}" ] && (cd "$OLD" && step 200 python3 bench/bench_library.py --no-compile --refine 1)
    ;;
  wholemodel)
    # every mode with and without kforge, the A/A rows, compile times, interleaved per model;
    # compiled kernel choices: WHOLEMODEL_TRIALS whole-model trials per mode family
    # (reduce-overhead shares default's, max-autotune's run as max-autotune-no-cudagraphs and
    # reuse its searches). With max-autotune one model takes most of a 10-minute call (the UNet
    # step ran past 240 s on an H100): WHOLEMODEL_MODELS=unet, then =llama, one call each;
    # WHOLEMODEL_MODES=eager,graphs,compile,reduce-overhead leaves max-autotune out.
    for model in ${WHOLEMODEL_MODELS:-unet llama}; do
      step "${WHOLEMODEL_LIMIT:-560}" "${bench_e2e[@]}" --models "$model" \
          --modes "${WHOLEMODEL_MODES:-all}" --trials "${WHOLEMODEL_TRIALS:-3}" --out "$out/e2e"
    done
    python3 bench/bench_e2e.py --summary "$out"/e2e/*.json >>"$log" 2>&1
    ;;
  fault)
    # The UNet measuring process that faulted with empty Inductor and Triton caches (runs H6 and
    # H9 in docs/BENCHMARKS.md): the same run, cold, with every launch synchronous, so the error
    # surfaces in the call that launched the faulting kernel and its note names the forward.
    cold=$(mktemp -d)
    TORCHINDUCTOR_CACHE_DIR=$cold/inductor TRITON_CACHE_DIR=$cold/triton CUDA_LAUNCH_BLOCKING=1 \
      step 400 "${bench_e2e[@]}" --models unet --modes eager,graphs,compile,reduce-overhead \
          --trials 3 --out "$out/e2e-fault"
    ;;
  regions)
    step 500 python3 bench/bench_regions.py --models llama,gemma4-decode --top 3 --iterations 6 \
        --out "$out/regions" --work "$work/regions"
    ;;
  integration)
    step 200 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 150 -rf \
        tests/integrate/test_backend_gpu.py tests/propose/test_region_families_gpu.py \
        tests/eval/test_counters.py
    step 250 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 120 -rf \
        tests/propose/test_matmul_gpu.py tests/propose/test_library_gpu.py
    ;;
  timing)
    step 150 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 120 -rA -s \
        tests/eval/test_timing_gpu.py
    # UNet and Llama; their databases (and projection errors) from the wholemodel track when it ran
    step 150 python3 bench/bench_timing.py --top 3 --iterations 3 --out "$out/timing" \
        --reuse --work "$work/e2e" --e2e-out "$out/e2e"
    step 200 python3 bench/bench_timing.py --models gemma4-decode --top 4 --iterations 4 \
        --out "$out/timing" --work "$work/timing" --e2e eager,graphs,compile,reduce-overhead
    python3 bench/bench_timing.py --summary "$out"/timing/*.json >>"$log" 2>&1
    ;;
  generate)  # GENERATE_MODELS=gemma4 GENERATE_BATCHES=1 for one row
    for model in ${GENERATE_MODELS:-gemma4 qwen35}; do
      for batch in ${GENERATE_BATCHES:-1 8}; do
        step 560 python3 bench/bench_generate.py "$model" --layers 8 --batch "$batch" \
            --prompt 2048 --new-tokens 256 --cache static --modes all \
            --out "$out/generate" --work "$work/generate-$batch"
      done
    done
    ;;
  sanitizer)
    step 170 python3 bench/bench_sanitizer.py --cases softmax,matmul --json "$out/sanitizer.json"
    ;;
  throughput)  # the Llama-shaped prefill and the UNet-style model; one: THROUGHPUT_MODELS=llama;
    # THROUGHPUT_WORKERS=3: search workers per GPU (default: kforge's own); each search's database
    # is copied to $out/throughput/<model>.db
    step "${THROUGHPUT_LIMIT:-540}" python3 bench/bench_throughput.py \
        --models "${THROUGHPUT_MODELS:-llama,unet}" \
        --time 240s --out "$out/throughput" --work "$work/throughput" \
        ${THROUGHPUT_WORKERS:+--workers "$THROUGHPUT_WORKERS"}
    ;;
  mainjob)  # the README's main job to completion: its wall time, then its search's figures
    mkdir -p "$work/main" && rm -f "$work/main/k.db"*
    step 590 python3 -m kforge search gemma4 --mode decode --top 8 --db "$work/main/k.db"
    python3 bench/bench_throughput.py --summary "$work/main/k.db" >>"$log" 2>&1
    ;;
  *) echo "unknown track $track" >&2; exit 2 ;;
esac
