#!/usr/bin/env bash
# The H200 benchmarks of docs/benchmarks.md: kinfer's MLX and llama.cpp engines vs mlx_lm.server and
# llama-cpp-python's server at concurrency 1/4/16/64, on random-weight Qwen3-0.6B and Qwen3.5-0.8B
# shapes (scripts/bench_models.py), plus the HTTP overhead at 64 rows. Offline: it needs only what
# /work/shared/gpu/README.md stages, plus the pure-Python packages below.
#
# Here, once per machine (the bench extras are for llama-cpp-python's server):
#   echo '/.gpu/' >> .git/info/exclude
#   ../shared/gpu/wheels.sh .gpu quart==0.22.0 hypercorn==0.18.0 gguf==0.19.0 pydantic==2.14.4 \
#       prometheus-client==0.26.0 fastapi uvicorn sse-starlette 'starlette-context<0.4' pydantic-settings
#   cp ../shared/gpu/stage.sh ../shared/gpu/setup.sh .gpu/
# There, one command each, back to back (each command may run 10 minutes at most):
#   bash .gpu/stage.sh .gpu/bundle-N                     # for every bundle
#   bash .gpu/setup.sh && bash scripts/bench_gpu.sh models      # ~5 min build + ~1 min models
#   bash scripts/bench_gpu.sh sweep qwen3-0.6b                  # ~4 min
#   bash scripts/bench_gpu.sh sweep qwen3.5-0.8b                # ~5 min
#   bash scripts/bench_gpu.sh http                              # ~2 min
#   bash scripts/bench_gpu.sh underload                         # ~6 min, MLX only (issue 18's GPU goals)
# MLX only (no llama.cpp build): stage the bundles that hold mlx, mlx-cuda-13, mlx-lm and the pure-Python
# wheels (wheels.sh also takes llguidance==1.9.1 and py-spy, for scripts/trace_ttft.py's PYSPY), then
#   bash scripts/gpu_mlx_only.sh && bash scripts/bench_gpu.sh models          # ~15 s + ~1 min
# Seen on 2026-12-02 (one command each, 10 minutes at most): a fresh machine ~80 s of the lease before
# the first command; `TARGETS=kinfer-mlx,mlx-lm LEVELS=1,16,64,256 sweep qwen3-0.6b` ~3 min;
# `TARGETS=kinfer-mlx LEVELS=1,64,256 sweep qwen3-0.6b` ~1.7 min; `TARGETS=kinfer-mlx,mlx-lm
# LEVELS=64,256 sweep qwen3.5-0.8b` over 5.5 min (it ran out a 330 s limit); with the bench's client
# processes (fifth session) `TARGETS=kinfer-mlx,mlx-lm LEVELS=64,256 sweep qwen3-0.6b` ~2 min, the same
# at LEVELS=64 for qwen3.5-0.8b ~2.8 min and at LEVELS=256 ~2.5 min: one level a call for qwen3.5.
# The CUDA-only tests run there too once pytest's wheels are staged (pip download pytest pluggy
# iniconfig packaging into a bundle): `python3 -m pytest -p no:cacheprovider tests/engines/mlx/...`.
# Results (JSON + markdown) go to $OUT (the run tool's output folder) or /tmp/kinfer-gpu-results.
set -euo pipefail
cd "$(dirname "$0")/.."

export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/site/bin:$PATH"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
MODELS=${MODELS:-/tmp/kinfer-gpu-models}
RESULTS=${OUT:-/tmp/kinfer-gpu-results}
SIZES=(qwen3-0.6b qwen3.5-0.8b)
LEVELS=${LEVELS:-1,4,16,64}
PROMPT=${PROMPT:-128}
TOKENS=${TOKENS:-256}
mkdir -p "$MODELS" "$RESULTS"

models() {
  "$PY" scripts/bench_models.py "$MODELS" "${SIZES[@]}" ${TINY:+--tiny}
}

sweep() {
  local size=${1:?size: qwen3-0.6b or qwen3.5-0.8b}
  [ -f "$MODELS/$size.gguf" ] || models
  "$PY" scripts/bench_peers.py --gpu --gguf "$MODELS/$size.gguf" --mlx-dir "$MODELS/$size" \
    --concurrency "$LEVELS" --prompt-tokens "$PROMPT" --max-tokens "$TOKENS" \
    --targets "${TARGETS:-kinfer-mlx,kinfer-llama,mlx-lm,llama-cpp}" --label-suffix " ($size)" \
    --json "$RESULTS/peers-$size.json" --markdown "$RESULTS/peers-$size.md" 2>&1 | grep -v ' INFO httpx'
}

http() {
  [ -f "$MODELS/qwen3-0.6b.gguf" ] || models
  "$PY" scripts/bench_http_overhead.py --weights "$MODELS/qwen3-0.6b.gguf" --rows "${ROWS:-16,64}" \
    --prompt-tokens "$PROMPT" --max-tokens "$TOKENS" --json "$RESULTS/http-overhead.json" \
    2>&1 | grep -v ' INFO httpx' | tee "$RESULTS/http-overhead.md"
}

# constrained decoding (issue 16): 16 rows under a JSON Schema vs free rows, both engines, and
# llama-server's constrained rows on the same GGUF (LLAMA_SERVER: the binary ../shared/peers/llama-server.sh
# builds there with `cuda`); ROUNDS: schema / free runs alternating (default 2); LLAMA_ONLY=1 skips MLX
constrained() {
  [ -f "$MODELS/qwen3-0.6b.gguf" ] || models
  "$PY" scripts/bench_constrained.py --engine llama --model "$MODELS/qwen3-0.6b.gguf" --rows 16 --http --rounds "${ROUNDS:-2}" \
    ${LLAMA_SERVER:+--llama-server "$LLAMA_SERVER"} 2>&1 | grep -v ' INFO httpx' | tee "$RESULTS/constrained-llama.md"
  [ -n "${LLAMA_ONLY:-}" ] || "$PY" scripts/bench_constrained.py --engine mlx --model "$MODELS/qwen3-0.6b" \
    --rows 16 --rounds "${ROUNDS:-2}" 2>&1 | tee "$RESULTS/constrained-mlx.md"
}

# issue 18's GPU goals in one command (MLX only: needs no llama.cpp build): first tokens at 64 and 256
# streams against mlx_lm.server, the memory account at 1/16/64 streams, a 50,000-token prompt beside 16
# decoding rows; with the engine's step log (scripts/step_log) for the 256-stream burst
underload() {
  [ -f "$MODELS/qwen3.5-0.8b/config.json" ] || models
  TARGETS=kinfer-mlx,mlx-lm LEVELS=64,256 sweep qwen3-0.6b
  cp "$RESULTS/peers-qwen3-0.6b.json" "$RESULTS/ttft-qwen3-0.6b.json"
  TARGETS=kinfer-mlx LEVELS=1,16,64 sweep qwen3.5-0.8b
  cp "$RESULTS/peers-qwen3.5-0.8b.json" "$RESULTS/memory-qwen3.5-0.8b.json"
  "$PY" scripts/bench_stalls.py --tree after=. --weights "$MODELS/qwen3.5-0.8b" --rows 16 --prompt-tokens "${STALL_PROMPT:-50000}" \
    --ctx 65536 --threads 0 --rounds 1 --json "$RESULTS/stalls-50k-qwen3.5.json" 2>&1 | grep -v 'INFO\|HTTP Request'
  KINFER_STEP_HOOK="$RESULTS/steps-256.log" KINFER_STEP_SLOW=0 PYTHONPATH="$PWD/scripts/step_log:$PYTHONPATH" \
    "$PY" scripts/trace_ttft.py 256 "$TOKENS" "$MODELS/qwen3-0.6b" "$RESULTS/trace-256.json" 2>&1 | grep -v ' INFO '
}

case "${1:-all}" in
  models) models ;;
  sweep) sweep "${2:-}" ;;
  http) http ;;
  constrained) constrained ;;
  underload) underload ;;
  all) models; for s in "${SIZES[@]}"; do sweep "$s"; done; http ;;
  *) echo "usage: $0 models | sweep SIZE | http | constrained | underload | all" >&2; exit 2 ;;
esac
ls -la "$RESULTS"
