# Shared set-up for scripts/run and scripts/test: create .venv if missing and install what this
# machine needs. Idempotent: a stamp keyed on pyproject.toml + extras skips pip when nothing changed.
# Usage: source scripts/_env.sh EXTRA[,EXTRA...]
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

EXTRAS="${1:-$(machine_extras)}"
PY="${LOCALINFER_PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv" >&2
  "$PY" -m venv .venv
fi
STAMP=".venv/.install-stamp"
WANT="$(cat pyproject.toml | sha256sum | cut -c1-16)-$EXTRAS"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] || ! .venv/bin/python -c "import localinfer" 2>/dev/null; then
  echo "installing localinfer[$EXTRAS] into .venv (llama-cpp-python builds once, ~5 min, then pip caches it)" >&2
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install -q -e ".[$EXTRAS]" >&2
  echo "$WANT" > "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
