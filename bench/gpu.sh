#!/usr/bin/env bash
# The GPU run of bench/gpu.py with the project venv's Python: one table (corpus embedding in fp32/bf16/fp16 as a share
# of the GPU's measured peak, answering at batch 64 against the CPU, a training step at searcher beam 5000, faiss-gpu
# search). A few minutes on one GPU; nothing is downloaded. Extra arguments go to bench/gpu.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$here/../.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
exec "$python" "$here/gpu.py" "$@"
