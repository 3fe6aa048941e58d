#!/usr/bin/env bash
# One H200 lease's MLX measurements, step by step (each step's output and files go to $OUT, which the
# device tool brings back). Stage first (scripts/bench_gpu.sh's header: ../shared/gpu/wheels.sh into an
# ignored .gpu/, llama-cpp-python's sdist parts left out), bringing each bundle along in its own call:
#   bash .gpu/stage.sh .gpu/bundle-2 ; bash .gpu/stage.sh .gpu/bundle-3          (the mlx-cuda parts)
#   bash scripts/gpu_visit.sh setup models STEP ...     (brings the last bundle, .gpu/stage.sh, the trees)
# Steps (N: any suffix, a run's name):
#   setup        stage $BUNDLE (default .gpu/bundle-4) and install the wheels, MLX only (~5 s)
#   models       random-weight qwen3-0.6b and qwen3.5-0.8b, MLX and GGUF (~60 s)
#   models1      $SIZE's alone (~30 s)
#   sweepN       HTTP sweep of kinfer MLX on $SIZE at LEVELS (default 1,64,256; ~100 s)
#   oldsweepN    the same sweep run by tree $TREE_A (its own scripts and code): a before / after pair
#   graphsN      two sweeps, MLX's data limit on a CUDA graph lifted then at the H200's default
#                (sweep-sweep-graphsN-{lifted,default}.json; docs/benchmarks.md, "H200, 2026-12-05"):
#                run it twice for ABAB (~200 s each)
#   stepsN       sweepN with every step logged, then read by rows decoding (read_step_log.py --decode): why
#                the 64-stream level runs at ~9,000 tok/s in some sweeps and ~6,000 in others (third session
#                of 2026-12-05); the log goes into steps.tar (~110 s)
#   lowmbN       two sweeps, MLX's data limit on a CUDA graph lowered to LOW_MB (default 250) then at the
#                H200's default: peak memory at 64 / 256 rows against tok/s (the lifted limit raised the
#                256-row peak by 10-15 GiB; does a lower one cut the transient?); run twice for ABAB (~200 s)
#   saN / sbN    a PROMPT-token prompt (default 30,000, --ctx $CTX, default 40,960) beside 16 streaming
#                rows through HTTP, tree $TREE_A (default .gpu-old) / $TREE_B (default this checkout),
#                every step logged and read (~90 s; the first server on a fresh machine compiles MLX's
#                kernels); qwen3-0.6b's context is 40,960 tokens, so a 50,000-token prompt needs
#                SIZE=qwen3.5-0.8b CTX=65536; KINFER_STEP_KERNELS=6@s712 records steps 712-717 of the server
#                kernel by kernel (the stall's slowest step on an H100 was the log's 715th in every run);
#                KINFER_STEP_SYNC=1 launches each pass once the device is done (step_log/sitecustomize.py);
#                the recorded steps' graphs are printed whole and a step that built graphs set against the next
#                (read_step_log.py --diff-graphs)
#   kernelsN     the stall scenario in-process (tree $TREE_B), KERNELS steps (default 2) recorded kernel
#                by kernel from KERNELS_AT of the prompt (default 0.0), new CUDA graphs named (~90 s); PER_STEP=1:
#                each step recorded apart, a line each (its host CUDA calls, its new graphs); AFTER: steps
#                run past the prompt's first token (default 10: KERNELS_AT=1 with KERNELS=14 AFTER=16
#                records its row joining, leaving and the steps after)
#   testsN       pytest on $TESTS (default tests/engines/mlx; pytest's wheels staged in the bundle), the whole
#                output kept in $R/testsN.txt: a device call brings back only the output's last 12,000 characters
#   inprocN      the stall scenario in-process, no profiler: the slowest steps from the prompt's arrival on
#                (ms, launch against the engine thread's CPU time in it; ~60 s)
# Seen on 2026-12-04 (sixth session): setup + models + two stall runs ~245 s of a call's 600.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
M=/tmp/kinfer-gpu-models
R=${OUT:-/tmp/kinfer-gpu-results}
SIZE=${SIZE:-qwen3-0.6b}
TREE_A=${TREE_A:-$PWD/.gpu-old}
TREE_B=${TREE_B:-$PWD}
mkdir -p "$R"

smi_start() {  # smi_start NAME: the GPU's memory in use as the driver sees it, every 0.5 s (MLX's
  # account leaves out what CUDA holds outside MLX's buffers: its memory pool, graphs, libraries)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$R/smi-$1.txt" 2>/dev/null &
  SMI=$!
}
smi_stop() {  # smi_stop NAME: the largest sample, the samples into steps.tar
  kill "$SMI" 2>/dev/null; wait "$SMI" 2>/dev/null
  echo "GPU memory used, largest sample: $(sort -n "$R/smi-$1.txt" | tail -1) MiB"
  tar -rf "$R/steps.tar" -C "$R" "smi-$1.txt" && rm "$R/smi-$1.txt"
}

stall() {  # stall TREE NAME
  smi_start "$2"
  KINFER_STEP_HOOK="$R/steps-$2.log" KINFER_STEP_SLOW=0 PYTHONPATH="$PWD/scripts/step_log:$PYTHONPATH" \
    python3 scripts/bench_stalls.py --tree "$2=$1" --weights "$M/$SIZE" --rows 16 \
    --prompt-tokens "${PROMPT:-30000}" --ctx "${CTX:-40960}" --row-tokens 8000 --threads 0 --rounds 1 \
    --json "$R/stalls-$2.json" 2>&1 | grep -v 'INFO\|HTTP Request' | tail -15
  smi_stop "$2"
  python3 scripts/read_step_log.py "$R/steps-$2.log" 2>&1 | tail -12
  # KINFER_STEP_KERNELS=N@TOKENS or N@sSTEP (step_log/sitecustomize.py): the recorded steps, a line each
  grep -E "^step |^  " "$R/steps-$2.log" | grep -v "^  graph [0-9]" | cut -c1-500 | head -40
  # what made a recorded step's graphs new: its kernels against the next step's
  python3 scripts/read_step_log.py --diff-graphs "$R/steps-$2.log" | cut -c1-300 | head -60
  gzip -f "$R/steps-$2.log"
  # one file for every run's log: a device call brings back a few files only (8 came back on 2026-12-05)
  tar -rf "$R/steps.tar" -C "$R" "steps-$2.log.gz" && rm "$R/steps-$2.log.gz"
}

for step in "$@"; do
  start=$(date +%s)
  case $step in
    setup) bash .gpu/stage.sh "${BUNDLE:-.gpu/bundle-4}" && bash scripts/gpu_mlx_only.sh ;;
    models) bash scripts/bench_gpu.sh models >/dev/null 2>&1; ls "$M" ;;
    models1) python3 scripts/bench_models.py "$M" "$SIZE" >/dev/null 2>&1; ls "$M" ;;
    graphs*)
      MLX_MAX_MB_PER_BUFFER=1000000 bash "$0" "sweep-$step-lifted"
      MLX_MAX_MB_PER_BUFFER=1000 bash "$0" "sweep-$step-default" ;;
    lowmb*)
      MLX_MAX_MB_PER_BUFFER=${LOW_MB:-250} bash "$0" "sweep-$step-low"
      MLX_MAX_MB_PER_BUFFER=1000 bash "$0" "sweep-$step-default" ;;
    steps*)
      KINFER_STEP_HOOK="$R/steps-$step.log" KINFER_STEP_SLOW=0 PYTHONPATH="$PWD/scripts/step_log:$PYTHONPATH" \
        bash "$0" "sweep-$step"
      python3 scripts/read_step_log.py --decode "$R/steps-$step.log" 2>&1 | tail -20
      gzip -f "$R/steps-$step.log"
      tar -rf "$R/steps.tar" -C "$R" "steps-$step.log.gz" && rm "$R/steps-$step.log.gz" ;;
    oldsweep*)  # sweepN from $TREE_A's own scripts and code (a before / after pair, ABAB)
      TARGETS=kinfer-mlx LEVELS=${LEVELS:-1,64,256} OUT=$R/tmp-$step bash "$TREE_A/scripts/bench_gpu.sh" sweep "$SIZE" 2>&1 \
        | grep -E 'tok/s|kinfer' | tail -8
      mv "$R/tmp-$step/peers-$SIZE.json" "$R/sweep-$step.json" && rm -rf "$R/tmp-$step" ;;
    sweep*)
      smi_start "$step"
      TARGETS=kinfer-mlx LEVELS=${LEVELS:-1,64,256} OUT=$R/tmp-$step bash scripts/bench_gpu.sh sweep "$SIZE" 2>&1 \
        | grep -E 'tok/s|kinfer' | tail -8
      smi_stop "$step"
      mv "$R/tmp-$step/peers-$SIZE.json" "$R/sweep-$step.json" && rm -rf "$R/tmp-$step" ;;
    sa*) stall "$TREE_A" "$step" ;;
    sb*) stall "$TREE_B" "$step" ;;
    inproc*)
      (cd "$TREE_B" && PYTHONPATH=/tmp/site:$TREE_B python3 scripts/profile_steps.py stall --weights "$M/$SIZE" \
        --rows 16 --prompt-tokens "${PROMPT:-30000}" --ctx "${CTX:-40960}" --row-tokens 8000 --before 30 \
        --after "${AFTER:-10}" --json "$R/$step.json") > "$R/$step.txt" 2>&1
      grep -v 'Warning\|_warn_once\|^prefill beside' "$R/$step.txt" | cut -c1-240 | tail -14 ;;
    kernels*)
      (cd "$TREE_B" && PYTHONPATH=$TREE_B/scripts/step_log:/tmp/site:$TREE_B python3 scripts/profile_steps.py stall \
        --weights "$M/$SIZE" --rows 16 --prompt-tokens "${PROMPT:-30000}" --ctx "${CTX:-40960}" --row-tokens 8000 \
        --before 30 --after "${AFTER:-10}" --kernels "${KERNELS:-2}" --kernels-at "${KERNELS_AT:-0.0}" ${PER_STEP:+--kernels-per-step} \
        --json "$R/$step.json") > "$R/$step.txt" 2>&1
      grep -v 'Warning\|_warn_once' "$R/$step.txt" | grep -v '^    ' | cut -c1-240 | head -40 ;;
    tests*)  # the CUDA tests of $TESTS (default: tests/engines/mlx), all output kept in $R/testsN.txt
      python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/engines/mlx} > "$R/$step.txt" 2>&1
      grep -E "^(FAILED|ERROR)|passed|failed" "$R/$step.txt" | tail -12 ;;
    *) echo "unknown step: $step" ;;
  esac
  echo "== $step $(( $(date +%s) - start )) s"
done
