# Shared by scripts/demo, scripts/test and scripts/bench. Sourced, not run.
set -euo pipefail
RELOKV_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# ccache sees paths relative to the build directory: build/ and scripts/mutants' scratch copy
# (build-mutants/src/build) then share its entries (the scratch build is mostly hits).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$RELOKV_ROOT}

# Debian 12 packages the build needs. Installed with apt-get when running as root; otherwise
# the exact command is printed and the script stops.
RELOKV_DEB_PACKAGES=(cmake ninja-build g++ clang libclang-rt-dev clang-format libxxhash-dev
  catch2 libbenchmark-dev libssl-dev libopenblas-dev ccache
  nlohmann-json3-dev libcli11-dev libhiredis-dev libboost1.81-dev redis-server python3 python3-pip python3-numpy python3-venv python3-dev)

relokv_ensure_packages() {
  local missing=() p
  for p in "${RELOKV_DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ]; then
    echo "relokv: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  else
    echo "relokv: missing Debian packages. Run:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
}

# The numpy reference tests run `python3` from PATH, which need not be Debian's (python3-numpy
# serves /usr/bin/python3 only, e.g. not a pyenv one): numpy from PyPI where it is missing.
relokv_ensure_numpy() {
  python3 -c 'import numpy' 2>/dev/null && return 0
  echo "relokv: installing numpy for $(command -v python3) (pip)" >&2
  python3 -m pip install -q numpy >&2 ||
    echo "relokv: could not install numpy; the numpy reference tests will report skipped" >&2
}

# The server tests drive relokv_server with OpenAI's Python client and pytest (PyPI).
relokv_ensure_server_clients() {
  python3 -c 'import openai, pytest' 2>/dev/null && return 0
  echo "relokv: installing openai and pytest for $(command -v python3) (pip)" >&2
  python3 -m pip install -q openai pytest >&2 ||
    echo "relokv: could not install openai/pytest; the server tests will report skipped" >&2
}

# The Python package (python/, docs/python.md): nanobind and scikit-build-core build it (PyPI).
relokv_ensure_python_build() {
  python3 -c 'import nanobind, scikit_build_core' 2>/dev/null && return 0
  echo "relokv: installing nanobind and scikit-build-core for $(command -v python3) (pip)" >&2
  python3 -m pip install -q nanobind scikit-build-core >&2 ||
    echo "relokv: could not install nanobind; the Python package is not built" >&2
}

# The span-link trainer (tools/links) and its tests: JAX's CPU wheels (~100 MB) and llama.cpp's
# gguf package (PyPI). Never PyTorch: its default wheel pulls ~2.5 GB of CUDA libraries.
relokv_ensure_links_trainer() {
  python3 -c 'import jax, gguf, ml_dtypes' 2>/dev/null && return 0
  echo "relokv: installing jax and gguf for $(command -v python3) (pip)" >&2
  python3 -m pip install -q -r "$RELOKV_ROOT/tools/links/requirements.txt" >&2 ||
    echo "relokv: could not install jax/gguf; the span-link tests will report skipped" >&2
}

# relokv_configure <build dir> [cmake args...]: configures once, reconfigures only when asked.
relokv_configure() {
  local dir=$1
  shift
  if [ ! -f "$dir/CMakeCache.txt" ] || [ $# -gt 0 ]; then
    cmake -S "$RELOKV_ROOT" -B "$dir" -G Ninja "$@" >&2
  fi
}

relokv_jobs() { nproc 2>/dev/null || echo 2; }

# relokv_skip_summary <build dir> <ctest output>: the tests ctest reported skipped, each with
# the reason it printed (its SKIPPED or "skipped" line in Testing/Temporary/LastTest.log).
relokv_skip_summary() {
  python3 - "$1/Testing/Temporary/LastTest.log" "$2" <<'PY'
import re, sys
try:
    log = open(sys.argv[1], errors="replace").read()
except OSError:
    log = ""
names = re.findall(r"^\s*\d+ - (\S+) \(Skipped\)$", open(sys.argv[2], errors="replace").read(), re.M)
if not names:
    print("relokv: no test skipped")
    sys.exit(0)
print(f"relokv: {len(names)} tests skipped:")
for name in names:
    m = re.search(r"^\d+/\d+ Test: " + re.escape(name) + r"\n.*?Output:\n-+\n(.*?)<end of output>",
                  log, re.S | re.M)
    lines = [l.strip() for l in (m.group(1) if m else "").splitlines()
             if "SKIPPED" in l or "skipped" in l]
    print(f"  {name}: {lines[0] if lines else '(no reason printed)'}")
PY
}
