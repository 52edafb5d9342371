# llama.cpp built from the llama-cpp-python sdist (.deps/sdist, fetched by scripts/setup-peers)
# for a chosen instruction set, sourced by the benchmarks that run it (bench-concurrent's
# llama-server, bench-vs-peers' --isa avx2 libraries). Never AMX: a native build put AMX
# kernels in, and a virtual machine that lists AMX without granting it killed the server
# (SIGILL).

# The cmake flags for an instruction set: "native" (what this CPU lists, AMX left out) or
# "avx2" (AVX2/FMA only, as on AMD EPYC machines without AVX-512).
llama_cpp_flags() { # native|avx2
  local flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
  local f
  if [[ "$1" == native ]]; then
    for f in avx512f:AVX512 avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx512vbmi:AVX512_VBMI avx_vnni:AVX_VNNI; do
      if grep -qw "${f%%:*}" /proc/cpuinfo; then flags+=("-DGGML_${f#*:}=ON"); fi
    done
  else
    flags+=(-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF)
  fi
  echo "${flags[*]}"
}

# Builds the given cmake targets into DIR/build/bin once per flag set (a stamp file keeps the
# flags it was built with) and prints that folder, which holds the programs and the shared
# libraries (libllama.so, libggml*.so) they load.
llama_cpp_build() { # DIR native|avx2 TARGET...
  local dir="$1" isa="$2"; shift 2
  local flags
  read -ra flags <<<"$(llama_cpp_flags "$isa")"
  local want="${flags[*]} targets: $*"
  if [[ "$(cat "$dir/.built" 2>/dev/null)" != "$want" ]]; then
    echo "[llama.cpp] building $* ($isa) from the llama-cpp-python sdist into $dir (about 10 minutes)" >&2
    rm -rf "$dir"
    mkdir -p "$dir/src"
    tar xzf "$ROOT"/.deps/sdist/llama_cpp_python-*.tar.gz -C "$dir/src" --strip-components=3 --wildcards '*/vendor/llama.cpp/*'
    cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF "${flags[@]}" >&2
    local t
    for t in "$@"; do cmake --build "$dir/build" --target "$t" -j 2 >&2; done
    echo "$want" >"$dir/.built"
  fi
  echo "$dir/build/bin"
}
