#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU as it is (issue 28): the H200 test machine has no network, its
# python3 holds CUDA torch, pytest, pytest-timeout and nvidia-ml-py but no IPython or Jupyter, and a venv would hide
# its torch. So nothing is downloaded, built or installed into an environment here: the wheels the image lacks come
# in .whl/ (made by scripts/gpu-wheels.sh on the development machine) and go into a temporary folder on
# PYTHONPATH; the package runs from this working tree.
#
#   here:  bash scripts/gpu-wheels.sh
#   there: bash scripts/gpu-check.sh          (the device tool: carry [".whl"])
#
# Steps, each with its own time limit, all within GPU_CHECK_BUDGET seconds (default 570): the machine's facts,
# nvidia-smi, the wheel install and a requirements check, `python3 -m jupyter_gpu check -v`, `check --distributed`
# and `allreduce`, every magic once in a real IPython shell (scripts/gpu_magics.py), %gpucells' cost per cell
# (bench/bench_gpucells.py), tutorial-written loops under %%gpuprofile (scripts/gpu_trials.py), then every gpu-marked test,
# one pytest process per test file. Writes $OUT/gpu-check.log (everything printed) and $OUT/gpu-check-summary.json
# (per test: outcome; per magic: headline and status; per command: exit code and first lines; wall time). A step
# that fails is recorded and the next one runs.
#
# Settings: PYTHON (default python3), OUT (default ./gpu-check-out), GPU_CHECK_BUDGET (default 570),
# GPU_CHECK_TEST_TIMEOUT (seconds per test, default 180), GPU_CHECK_WHEELS (the wheelhouse, default .whl).
set -uo pipefail  # no -e: every step runs and is recorded, whatever the one before did
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
OUT=${OUT:-$REPO/gpu-check-out}
BUDGET=${GPU_CHECK_BUDGET:-570}  # the H200 run needed about 620 s for all; see docs/internals.md
TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-180}
WHEELS=${GPU_CHECK_WHEELS:-.whl}
RESERVE=15  # seconds kept back for the summary
STARTED=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jupyter-gpu-check.XXXXXX")
SITE=$WORK/site
mkdir -p "$OUT" "$WORK/junit" "$WORK/out"
LOG=$OUT/gpu-check.log

# The gpu-marked test files in the order they run: the cheap ones first, so a short budget still covers the most,
# and those that compile (torch.compile) or start servers and NCCL ranks last. Files not named here run between.
FIRST=(tests/e2e/gpu/test_real_gpu.py tests/e2e/gpu/test_gpuprofile_gpu.py tests/e2e/gpu/test_gpupanel_gpu.py
       tests/e2e/gpu/test_gpumem_gpu.py tests/e2e/gpu/test_gputime_gpu.py tests/e2e/gpu/test_batchprobe_gpu.py)
LAST=(tests/e2e/gpu/test_server_gpu.py tests/e2e/gpu/test_distributed_gpu.py tests/e2e/gpu/test_speedprobe_gpu.py)
declare -A FILE_LIMIT=([tests/e2e/gpu/test_server_gpu.py]=150 [tests/e2e/gpu/test_distributed_gpu.py]=180
                       [tests/e2e/gpu/test_speedprobe_gpu.py]=240)
DEFAULT_FILE_LIMIT=120

step() {  # step NAME LIMIT COMMAND...: run COMMAND under a time limit cut to what is left of the budget; record it
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - RESERVE - ($(date +%s) - STARTED)))
  local output="$WORK/out/${name//[^A-Za-z0-9._-]/_}.txt"
  if ((left < 10)); then
    echo "=== $name: not run, the ${BUDGET} s budget is spent"
    printf '%s\tskipped\t\t0\t%s\t\n' "$name" "$limit" >>"$WORK/steps.tsv"
    return 0
  fi
  ((limit > left)) && limit=$left
  local shown="$*"
  ((${#shown} > 400)) && shown="${shown:0:400} …"
  echo "=== [+$(($(date +%s) - STARTED)) s] $name (at most $limit s): $shown"
  local begun=$EPOCHREALTIME
  # timeout puts the command in a process group of its own and ends the whole group: test servers, kernels and
  # NCCL ranks a stopped step started go with it.
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$output"
  local rc=${PIPESTATUS[0]}
  local seconds status=ok
  seconds=$(awk -v a="$begun" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
  if ((rc == 124 || rc == 137)); then
    status=timeout
  elif ((rc == 5)) && [[ $name == pytest:* ]]; then
    status=ok  # pytest's "no tests ran": the file skipped itself at collection (its junit XML says why)
  elif ((rc != 0)); then
    status=failed
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$seconds" "$limit" "$output" >>"$WORK/steps.tsv"
  echo "=== $name: $status (exit $rc) in $seconds s"
  return "$rc"
}

summary() {
  timeout 60 "$PY" scripts/gpu_support.py summary "$WORK" "$OUT/gpu-check-summary.json" --started "$STARTED" \
    --budget "$BUDGET"
  echo "log: $LOG; summary: $OUT/gpu-check-summary.json; work folder: $WORK"
}

gpu_test_files() {  # every test file with a gpu-marked test, in running order
  local found file
  # A decorator, or a module's pytestmark: not the words in a string or a comment.
  mapfile -t found < <(grep -rlE --include='test_*.py' '^\s*@pytest\.mark\.gpu\b|^pytestmark\b.*\bpytest\.mark\.gpu\b' \
    tests | sort)
  for file in "${FIRST[@]}"; do [[ " ${found[*]} " == *" $file "* ]] && echo "$file"; done
  for file in "${found[@]}"; do [[ " ${FIRST[*]} ${LAST[*]} " == *" $file "* ]] || echo "$file"; done
  for file in "${LAST[@]}"; do [[ " ${found[*]} " == *" $file "* ]] && echo "$file"; done
}

main() {
  echo "GPU check of $(git log -1 --format='%h %s' 2>/dev/null || echo 'this working tree'); budget $BUDGET s"
  # The wheelhouse first, then the working tree: the package and tests/ come from here, never from an install.
  export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
  # Jupyter's and IPython's folders in the work folder: nothing from the machine's home, nothing left in it. The
  # server extension is enabled as the wheel's etc/jupyter file would (there is no wheel here).
  export JUPYTER_CONFIG_DIR=$WORK/jupyter/config JUPYTER_DATA_DIR=$WORK/jupyter/data
  export JUPYTER_RUNTIME_DIR=$WORK/jupyter/runtime IPYTHONDIR=$WORK/ipython JUPYTER_PLATFORM_DIRS=1
  export JUPYTER_GPU_CACHE_DIR=$WORK/cache
  mkdir -p "$JUPYTER_CONFIG_DIR/jupyter_server_config.d"
  cp jupyter-config/server-config/*.json "$JUPYTER_CONFIG_DIR/jupyter_server_config.d/"

  step facts 60 "$PY" scripts/gpu_support.py facts --json "$WORK/machine.json"
  if command -v nvidia-smi >/dev/null; then
    step nvidia-smi 30 nvidia-smi
    step "nvidia-smi topo -m" 30 nvidia-smi topo -m
  else
    echo "nvidia-smi: not on PATH"
  fi

  if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "no wheels in $WHEELS: run 'bash scripts/gpu-wheels.sh' on the development machine and carry .whl"
    printf 'install-wheels\tfailed\t1\t0\t0\t\n' >>"$WORK/steps.tsv"
    summary
    return 2
  fi
  # --no-deps: .whl is the whole set, checked against the image by gpu-wheels.sh; --no-index: no network here.
  if ! step install-wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$SITE" "$WHEELS"/*.whl; then
    summary
    return 2
  fi
  step requirements 30 "$PY" scripts/gpu_support.py installed --pyproject pyproject.toml --require ipykernel \
    --require jupyter-client --require jupyterlab --require nbformat --require pytest --require pytest-timeout \
    --json "$WORK/requirements.json"

  # `python3 -m jupyter_gpu`: the `jupyter-gpu` console script exists only where the package is installed.
  step "cli:check -v" 90 "$PY" -m jupyter_gpu check -v
  step "cli:check --distributed" 90 "$PY" -m jupyter_gpu check --distributed
  step "cli:allreduce --sizes 1M,64M --iterations 5" 120 "$PY" -m jupyter_gpu allreduce --sizes 1M,64M \
    --iterations 5
  step magics 180 "$PY" scripts/gpu_magics.py --out "$WORK/magics.json" --timeout 60
  # %gpucells' cost per cell with CUDA initialised (issue 33), which only a GPU can measure; fewer cells than the
  # bench's default, since it shares this budget.
  step "bench:gpucells" 60 "$PY" bench/bench_gpucells.py --cells 300 --rounds 3

  # One pytest process per file. CUDA state lives as long as the process: the context and the allocator's
  # statistics and cache, the memory-fraction cap, cuBLAS workspaces, cudnn and TF32 flags, compiled graphs. A file's
  # tests are written to share a process (module-scoped shells and models); two files are not. A process per test
  # would pay a torch import and a CUDA context (seconds each) for each of some forty tests; the tests that must
  # see a process where CUDA was never initialised start one themselves. pytest-forked is not in the image, and
  # xdist would run files side by side on the one GPU, which the timing and memory tests must not share.
  # Plugin autoloading is off so that only pytest-timeout joins from the image's many pytest plugins;
  # `-o addopts=""` drops the project's `-m "not gpu" --nbval` (nbval is not there).
  local file trials_done=0
  while read -r file; do
    if ((!trials_done)) && [[ " ${FIRST[*]} " != *" $file "* ]]; then
      # After the cheap files: tutorial-written training loops under %%gpuprofile and the probe commands its
      # reports print (issue 31), before the files that compile or start servers and NCCL ranks.
      step trials 240 "$PY" scripts/gpu_trials.py --out "$WORK/trials.json" --timeout 60
      trials_done=1
    fi
    step "pytest:$file" "${FILE_LIMIT[$file]:-$DEFAULT_FILE_LIMIT}" \
      env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PY" -m pytest -p pytest_timeout -p no:cacheprovider -o addopts="" \
      -m gpu --timeout="$TEST_TIMEOUT" -v -s -rfEs --junitxml="$WORK/junit/${file//\//__}.xml" "$file"
  done < <(gpu_test_files)

  summary
  awk -F '\t' '$2 == "failed" || $2 == "timeout" {bad = 1} END {exit bad}' "$WORK/steps.tsv"
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
