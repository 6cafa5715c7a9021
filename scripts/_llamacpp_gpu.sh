# Sourced by _env.sh after the install: llama-cpp-python rebuilt with this machine's GPU backend,
# so a GGUF runs with its layers on the GPU (backends/routing.py). pip builds llama-cpp-python
# for the CPU only; on a Mac its build turns Metal on by itself, so this acts only when an NVIDIA
# driver answers: with the system's CUDA toolkit (nvcc on PATH, else in $CUDA_HOME, by default
# /usr/local/cuda), GGML_CUDA=on. The wheel is kept in the user's cache keyed by version and
# flags (pip's own cache keys a build by its source alone, and would hand back the CPU wheel).
# A failed or impossible build is said once, with the command that fixes it; the CPU build stays.
# Set LOCALINFER_NO_GPU_BUILD=1 to skip.
llamacpp_gpu_build() {
  [ -z "${LOCALINFER_NO_GPU_BUILD:-}" ] || return 0
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || return 0
  local py=.venv/bin/python
  "$py" -c "import llama_cpp" 2>/dev/null || return 0  # the llamacpp extra is not installed
  # A GPU device in ggml's registry (llama_supports_gpu_offload alone also says yes for the RPC
  # backend every build has).
  if "$py" -c "import ctypes, sys, llama_cpp; from llama_cpp import _ggml; f = _ggml.libggml.ggml_backend_dev_by_type; f.restype = ctypes.c_void_p; f.argtypes = [ctypes.c_int]; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() and (f(1) or f(2)) else 1)" 2>/dev/null; then
    return 0
  fi
  local version args key dir nvcc="" library_only
  # Only the libraries the package loads (scripts/cmake/llamacpp-library-only.cmake says why).
  library_only="-DCMAKE_PROJECT_llama.cpp_INCLUDE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cmake/llamacpp-library-only.cmake"
  version="$("$py" -c "from importlib.metadata import version; print(version('llama-cpp-python'))")"
  args="-DGGML_CUDA=on -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF"  # RPC: as _env.sh builds it
  key="$(printf '%s %s' "$version" "$args" | sha256sum | cut -c1-10)"
  dir="${XDG_CACHE_HOME:-$HOME/.cache}/localinfer-dev/llamacpp-cuda-$version-$key"
  local fix="CMAKE_ARGS=\"$args\" .venv/bin/pip install --force-reinstall --no-cache-dir llama-cpp-python==$version"
  if [ -f "$dir/FAILED" ]; then
    return 0  # said once already; remove $dir to try again
  fi
  if ! ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    for candidate in "$(command -v nvcc 2>/dev/null || true)" "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"; do
      if [ -n "$candidate" ] && [ -x "$candidate" ]; then nvcc="$candidate"; break; fi
    done
    mkdir -p "$dir"
    if [ -z "$nvcc" ]; then
      echo "an NVIDIA GPU is here, but no CUDA toolkit (nvcc) was found: llama.cpp runs GGUF models on the CPU. Install the CUDA toolkit, then: $fix" >&2
      echo "no nvcc" > "$dir/FAILED"
      return 0
    fi
    echo "building llama-cpp-python $version with CUDA ($nvcc; several minutes, once per machine)" >&2
    if ! CUDACXX="$nvcc" CMAKE_ARGS="$args $library_only" "$py" -m pip wheel -q --no-deps --no-binary llama-cpp-python \
      -w "$dir" "llama-cpp-python==$version" >"$dir/build.log" 2>&1; then
      echo "the CUDA build of llama-cpp-python failed ($dir/build.log): llama.cpp runs on the CPU. To retry: $fix" >&2
      echo "build failed" > "$dir/FAILED"
      return 0
    fi
  fi
  "$py" -m pip install -q --force-reinstall --no-deps "$dir"/llama_cpp_python-*.whl >&2
}
llamacpp_gpu_build
