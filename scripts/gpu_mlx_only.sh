#!/usr/bin/env bash
# On the H200 machine: install the staged wheels into /tmp/site without building llama.cpp (MLX runs
# only, ~15 s instead of setup.sh's ~5 min build); an empty llama_cpp package stands in for
# llama-cpp-python so kinfer's imports resolve (kinfer/libllama_first.py tolerates it).
# Stage only the bundles without the llama-cpp-python sdist's parts (see scripts/bench_gpu.sh's header),
# then:  bash scripts/gpu_mlx_only.sh && bash scripts/bench_gpu.sh models
set -euo pipefail
cd /tmp/stage
for first in *.part-00; do
  [ -e "$first" ] || continue
  base=${first%.part-00}; cat "$base".part-* > "$base" && rm -f "$base".part-*
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ./*.whl
if [ ! -f /tmp/site/llama_cpp/llama_cpp.py ]; then
  mkdir -p /tmp/site/llama_cpp && touch /tmp/site/llama_cpp/__init__.py /tmp/site/llama_cpp/llama_cpp.py
fi
PYTHONPATH=/tmp/site python3 -c "import mlx.core as mx, llguidance; print('mlx', mx.__version__, mx.default_device())"
