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
  echo "installing localinfer[$all_extras] into .venv (llama-cpp-python builds once, ~5 min; pip caches it)" >&2
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install -q -e ".[$all_extras]" >&2
  echo "$hash $all_extras" > "$STAMP"
fi
source "$ROOT/scripts/_llamacpp_gpu.sh"
export PATH="$ROOT/.venv/bin:$PATH"
