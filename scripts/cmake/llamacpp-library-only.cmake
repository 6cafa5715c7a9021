# Included right after llama.cpp's own project() call while pip builds llama-cpp-python
# (scripts/_env.sh passes it as CMAKE_PROJECT_llama.cpp_INCLUDE). llama-cpp-python forces
# llama.cpp's `common` library on (with cpp-httplib, about a third of the compile), yet its
# Python package loads only libllama, libmtmd and the ggml libraries. llama.cpp builds those
# without `common` (mtmd must not link it), so this turns it off again.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
