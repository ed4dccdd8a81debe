#!/usr/bin/env bash
# Run HERE, before a GPU check: downloads into .whl/ (git-ignored) exactly the wheels that scripts/gpu-check.sh
# needs on the H200 test machine and that machine's image lacks, then checks here, without a network, that they
# and the image's own packages meet every requirement. The device call then carries .whl (see docs/internals.md,
# "Running the GPU check").
#
# The GPU machine has no network, Python 3.12 with CUDA torch, pytest, pytest-timeout, pytest-xdist, numpy,
# matplotlib, nvidia-ml-py and about 200 more packages (/work/.library/device/KINDS.md), and none of IPython,
# ipykernel, ipywidgets, jupyter_server or jupyterlab. What the GPU tests import beyond the image:
#   IPython                 every magic, tests/conftest.py
#   ipywidgets              %gpupanel (tests/e2e/gpu/test_gpupanel_gpu.py)
#   jupyterlab, ipykernel,  tests/e2e/gpu/test_server_gpu.py: a real JupyterLab server (tests/fixtures/lab_server.py
#   jupyter_client, nbformat  runs `python -m jupyterlab`) whose notebook kernel allocates CUDA memory
# and the jupyter_server extension (a dependency of the package). No labextension build: the side panel's tests are
# not GPU tests.
#
#   bash scripts/gpu-wheels.sh            download what is missing, drop what is not pinned, check
#   PYTHON312=/path/python3.12 bash ...   also resolve with pip --no-index in that interpreter's environment (one
#                                         that holds the image's packages: the rehearsal's stand-in)
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=.whl
# One version of each (two stop the whole install there). The versions are those of the development venv, which
# runs the CPU suite against them; the set is what `pip install --dry-run --report` resolved for the projects
# above on cp312 manylinux x86_64, less what the image has (IMAGE below).
PINS=(
  argon2-cffi==25.1.0 argon2-cffi-bindings==26.2.0 arrow==1.4.0 asttokens==3.0.2 async-lru==2.4.0 babel==2.19.0
  beautifulsoup4==4.15.0 bleach==6.4.0 cffi==2.1.1 comm==0.2.3 debugpy==1.8.22 defusedxml==0.7.1 executing==2.3.0
  fastjsonschema==2.22.3 fqdn==1.6.0 ipykernel==7.4.0 ipython==9.18.1 ipython-pygments-lexers==1.1.1
  ipywidgets==8.1.9 isoduration==20.11.0 jedi==0.20.1 json5==0.17.3 jsonpointer==3.12 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 jupyter-builder==1.3.0 jupyter-client==8.10.0 jupyter-core==5.9.1
  jupyter-events==0.12.1 jupyter-lsp==2.3.1 jupyter-server==2.21.1 jupyter-server-terminals==0.5.4
  jupyterlab==4.6.6 jupyterlab-pygments==0.3.0 jupyterlab-server==2.28.1 jupyterlab-widgets==3.0.17 lark==1.3.1
  matplotlib-inline==0.2.2 mistune==3.4.0 nbclient==0.11.0 nbconvert==7.17.2 nbformat==5.11.1 nest-asyncio2==1.7.4
  notebook-shim==0.2.4 pandocfilters==1.5.1 parso==0.8.7 pexpect==4.9.0 platformdirs==4.14.9 prompt-toolkit==3.0.53
  ptyprocess==0.7.0 pure-eval==0.2.4 pycparser==3.12 python-json-logger==4.2.0 pyzmq==27.3.0 referencing==0.37.0
  rfc3339-validator==0.1.4 rfc3986-validator==0.1.1 rfc3987-syntax==1.1.0 rpds-py==2026.9.1 send2trash==2.2.0
  soupsieve==4.1.3 stack-data==0.6.3 terminado==0.18.1 tinycss2==1.5.1 tornado==6.6.1 traitlets==5.16.1
  tzdata==2026.6 uri-template==1.3.0 wcwidth==0.9.4 webcolors==25.10.0 webencodings==0.6.1 websocket-client==1.9.2
  widgetsnbextension==4.0.16
)
# The image's projects that these wheels or the GPU check ask for (KINDS.md's list): never carried, since a carried
# copy would shadow the image's on PYTHONPATH. Their versions are checked there (gpu_support.py installed).
IMAGE="anyio attrs certifi charset-normalizer h11 httpcore httpx idna jinja2 markupsafe matplotlib numpy nvidia-ml-py
packaging prometheus-client psutil pygments pytest pytest-timeout pytest-xdist python-dateutil pyyaml requests six
typing-extensions urllib3"
# What the GPU check itself imports, beside the package's own dependencies (pyproject.toml).
REQUIRE=(ipykernel jupyter-client jupyterlab nbformat pytest pytest-timeout numpy matplotlib)
LIMIT_MIB=60  # the device tool carries 64 MiB with the working tree (about 3 MiB)

mkdir -p "$WHEELS"
# Drop wheels of versions no longer pinned, so an upgrade never leaves two versions behind.
python3 - "$WHEELS" "${PINS[@]}" <<'EOF'
import re, sys
from pathlib import Path
folder, pins = Path(sys.argv[1]), {re.sub(r"[-_.]+", "-", p.split("==")[0]).lower(): p.split("==")[1]
                                   for p in sys.argv[2:]}
for wheel in folder.glob("*.whl"):
    name, version = wheel.name.split("-")[:2]
    if pins.get(re.sub(r"[-_.]+", "-", name).lower()) != version:
        print(f"removing {wheel.name}: not pinned")
        wheel.unlink()
EOF
quietly() {  # run "$@"; show its output without pip's notes on absent file:// indexes and on each wheel it reads
  local log status=0
  log=$(mktemp)
  "$@" >"$log" 2>&1 || status=$?
  grep -v -e "is ignored: it is neither a file nor a directory" -e "^Processing " "$log" || true
  rm -f "$log"
  return "$status"
}

# --no-deps: the pins are the whole set; pip would otherwise also fetch what the image already has.
quietly python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
  --platform manylinux1_x86_64 -d "$WHEELS" "${PINS[@]}"

count=$(find "$WHEELS" -maxdepth 1 -type f -name '*.whl' | wc -l)
bytes=$(find "$WHEELS" -maxdepth 1 -type f -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
echo "$count wheels (${#PINS[@]} pinned), $((bytes / 1048576)) MiB in $WHEELS"
[ "$count" -eq "${#PINS[@]}" ] || { echo "expected ${#PINS[@]} wheels" >&2; exit 1; }
[ "$bytes" -lt $((LIMIT_MIB * 1048576)) ] || { echo "over $LIMIT_MIB MiB" >&2; exit 1; }

# Offline check 1: every requirement of every wheel (extras and cp312 Linux markers followed) is met by exactly one
# wheel at a fitting version or by the image, and every wheel is needed by something.
requires=(--pyproject pyproject.toml)
for name in "${REQUIRE[@]}"; do requires+=(--require "$name"); done
python3 scripts/gpu_support.py closure "$WHEELS" --provided "$IMAGE" "${requires[@]}"

# Offline check 2: pip's own resolver, with no index, in an environment that stands in for the image.
if [ -n "${PYTHON312:-}" ]; then
  # No configuration: this machine's pip.conf adds find-links (/opt/wheels) that would fill gaps in .whl.
  quietly env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null "$PYTHON312" -m pip install --dry-run --no-index --find-links "$WHEELS" --only-binary=:all: \
    ipython ipywidgets jupyter_server ipykernel jupyter_client jupyterlab nbformat
  echo "pip resolved the set with --no-index in $PYTHON312's environment"
fi
