#!/usr/bin/env bash
# Creates tests/reference/.venv with the pinned reference tooling
# (torch CPU use, transformers, gguf, llama-cpp-python built from source).
# Usage (from anywhere):  tests/reference/setup.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3
"$py" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || { echo "need Python 3.11 (set PYTHON=...)" >&2; exit 1; }
if [ ! -x "$here/.venv/bin/python" ]; then
  "$py" -m venv "$here/.venv"
fi
"$here/.venv/bin/pip" install --upgrade pip
# llama-cpp-python ships only an sdist: it compiles llama.cpp with cmake.
# GGML_NATIVE=OFF gives a portable x86-64 build (AVX/AVX2/FMA/F16C, no -march=native),
# so the recorded llama.cpp logits do not depend on the generating machine's CPU flags.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
"$here/.venv/bin/pip" install -r "$here/requirements.txt"
echo "ok: $here/.venv ready; now run: $here/.venv/bin/python $here/make_fixtures.py"
