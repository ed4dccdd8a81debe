#!/usr/bin/env bash
# Run on a machine with an NVIDIA GPU: the gpu-marked tests, then the real diagnosis, printed for the record.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { python3 -m venv .venv && $PY -m pip install -q -e '.[test]'; }
nvidia-smi || true
$PY -m pytest -p no:cacheprovider -o addopts="" -m gpu tests -v -s
status=$?
$PY -m jupyter_gpu check -v
nvidia-smi topo -m || true  # to compare with the matrix below
$PY -m jupyter_gpu check --distributed --bench || status=$?
$PY bench/bench_allreduce.py --markdown || true  # NCCL figures for docs/benchmarks.md
exit $status
