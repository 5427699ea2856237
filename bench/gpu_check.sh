#!/usr/bin/env bash
# GPU check for Chorus. On a machine with an NVIDIA GPU and the repository:
# builds only what the check needs (cmake + ninja): the CUDA reduce targets,
# and where the full project configures, the worker's GPU path tests and the
# daemons they start; runs the tests labelled gpu (kernels against the CPU
# engine, device buffers, all-reduce of 2 and 4 ranks on GPU 0, mixed
# Cpu/Cuda groups, GPU memory by pointer, ranks through daemons, the nccl
# plan's kinds on one rank where built with NCCL), runs the
# kernel bandwidth benchmark, chorus-bench's all-reduce with buffers on the
# CPU and on the GPU side by side, then the torch tests marked gpu (CUDA tensors
# through the chorus backend, DDP on GPUs) where /usr/bin/python3 has torch
# with CUDA, and prints one table. Without a GPU it says so
# and exits 0. Meant to finish within about 10 minutes (the full project's build is
# most of it).
#
# A GPU machine that lacks the build's dependencies (Abseil, GoogleTest,
# gRPC, ...) runs binaries packed on a machine that has them:
#   here:  bench/gpu_check.sh --pack DIR [build-dir]   (default build-dir:
#          <repo>/build, configured with CUDA) builds the GPU tests, the
#          benchmark and the daemons, and copies them, stripped, to DIR/bin
#          with the shared libraries they need beyond glibc in DIR/lib;
#   there: bench/gpu_check.sh --prebuilt DIR   runs them (no build).
#
# Usage: bench/gpu_check.sh [build-dir]     (default: <repo>/build-gpu-check)
#        bench/gpu_check.sh --pack DIR [build-dir]
#        bench/gpu_check.sh --prebuilt DIR
# Environment: JOBS (default: nproc), BENCH_MIB (256), BENCH_ITERS (20),
# GPU_CHECK_STANDALONE=1 to skip the full project and build bench/gpu_check.
# Exit status: 0 when the GPU tests pass (or there is no GPU; --pack: when
# the pack is complete), 1 otherwise, 2 for a usage error.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The packed programs: the GPU tests, the kernel benchmark, and the daemons
# the collectives test starts.
packed_tests=(gpu_reduce_test device_buffers_test gpu_collectives_test)
packed_programs=("${packed_tests[@]}" gpu_reduce_bench chorus-coordinator
                 chorus-worker chorusctl chorus-bench)
prebuilt=""
case "${1:-}" in
  --pack)
    [ $# -ge 2 ] || { echo "usage: $0 --pack DIR [build-dir]" >&2; exit 2; }
    pack="$2"
    tree="${3:-${root}/build}"
    [ -f "${tree}/CMakeCache.txt" ] || {
      echo "gpu_check: ${tree} is not a configured build tree" >&2; exit 1; }
    cmake --build "${tree}" --target "${packed_programs[@]}" || exit 1
    rm -rf "${pack}" && mkdir -p "${pack}/bin" "${pack}/lib" || exit 1
    for name in "${packed_programs[@]}"; do
      binary="$(find "${tree}" -type f -name "${name}" -perm -u+x | head -n 1)"
      [ -n "${binary}" ] || {
        echo "gpu_check: ${name} was not built in ${tree}" >&2; exit 1; }
      # Symbols stay, for a debugger's backtraces there.
      strip --strip-debug -o "${pack}/bin/${name}" "${binary}" || exit 1
    done
    # Every library the programs load except glibc's own, which the GPU
    # machine has (in a version at least as new, for these to start).
    ldd "${pack}"/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u |
      grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
      while read -r lib; do cp -L "${lib}" "${pack}/lib/" || exit 1; done ||
      exit 1
    echo "gpu_check: packed $(ls "${pack}/bin" | wc -l) programs and" \
         "$(ls "${pack}/lib" | wc -l) libraries ($(du -sh "${pack}" | cut -f1))" \
         "in ${pack}; on the GPU machine: bench/gpu_check.sh --prebuilt ${pack}"
    exit 0
    ;;
  --prebuilt)
    [ $# -eq 2 ] || { echo "usage: $0 --prebuilt DIR" >&2; exit 2; }
    prebuilt="$(cd "$2" 2>/dev/null && pwd)" || {
      echo "gpu_check: no folder $2" >&2; exit 1; }
    build="${prebuilt}/run"
    # The packed libraries, and the packed daemons for the tests to start.
    export LD_LIBRARY_PATH="${prebuilt}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    export CHORUS_TEST_BIN_DIR="${prebuilt}/bin"
    ;;
  -*)
    echo "usage: $0 [build-dir] | --pack DIR [build-dir] | --prebuilt DIR" >&2
    exit 2
    ;;
  *)
    build="${1:-${root}/build-gpu-check}"
    ;;
esac
jobs="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
mib="${BENCH_MIB:-256}"
iters="${BENCH_ITERS:-20}"
log="${build}/gpu_check.log"

say() { printf 'gpu_check: %s\n' "$*"; }
# Prints the path of the built executable named $1 under the build tree.
find_binary() { find "${tree}" -type f -name "$1" -perm -u+x | head -n 1; }

# ---- Is there a GPU? ---------------------------------------------------------
gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null |
              head -n 1)"
elif ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1 || [ -e /dev/nvidia0 ]; then
  gpu_name="NVIDIA GPU (nvidia-smi not installed)"
fi
if [ -z "${gpu_name}" ]; then
  say "no NVIDIA GPU found (nvidia-smi lists none, no /dev/nvidia0);" \
      "nothing to check"
  exit 0
fi
# What the machine has, first: the driver and CUDA version it supports, and
# each GPU with its compute capability (the build has kernels for 8.0 and
# 9.0 and PTX for 9.0; an older GPU is refused at registration).
gpus_table=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus_table="$(nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version \
                  --format=csv,noheader 2>/dev/null | sed 's/^/  /')"
  cuda_line="$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -n 1)"
  say "driver: ${cuda_line:-CUDA version unknown}; GPUs (index, name, compute" \
      "capability, memory, driver):"
  printf '%s\n' "${gpus_table}"
fi
command -v nvcc >/dev/null 2>&1 &&
  say "toolkit: $(nvcc --version | grep -o 'release [0-9.]*' | head -n 1)"

# ---- Toolchain --------------------------------------------------------------
if [ -n "${prebuilt}" ]; then
  :  # nothing to build
elif ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:${PATH}"
  else
    say "a GPU is present (${gpu_name}) but no CUDA toolkit: nvcc is neither" \
        "on PATH nor in /usr/local/cuda/bin"
    exit 1
  fi
fi
for tool in cmake ninja; do
  if [ -z "${prebuilt}" ] && ! command -v "${tool}" >/dev/null 2>&1; then
    say "${tool} is not installed"
    exit 1
  fi
done
mkdir -p "${build}"
: >"${log}"

# ---- Configure and build only what the check needs ---------------------------
# The full project first; if its other dependencies (gRPC, protobuf, glog) are
# missing, the standalone project in bench/gpu_check builds the same sources.
started=$(date +%s)
mode="full project"
if [ -n "${prebuilt}" ]; then
  mode="prebuilt"
  tree="${prebuilt}/bin"
elif [ "${GPU_CHECK_STANDALONE:-0}" = 1 ] ||
   ! cmake -S "${root}" -B "${build}/full" -G Ninja \
     -DCMAKE_BUILD_TYPE=Release -DCHORUS_CUDA=ON >>"${log}" 2>&1; then
  mode="standalone (bench/gpu_check)"
  [ "${GPU_CHECK_STANDALONE:-0}" = 1 ] ||
    say "the full project does not configure here (see ${log});" \
        "using the standalone reduce build"
  if ! cmake -S "${root}/bench/gpu_check" -B "${build}/standalone" -G Ninja \
       -DCMAKE_BUILD_TYPE=Release >>"${log}" 2>&1; then
    tail -n 30 "${log}"
    say "configure failed. Where this machine lacks the dependencies, pack" \
        "the binaries on one that has them (bench/gpu_check.sh --pack DIR)" \
        "and run them here with bench/gpu_check.sh --prebuilt DIR"
    exit 1
  fi
  tree="${build}/standalone"
else
  tree="${build}/full"
fi
targets=(gpu_reduce_test gpu_reduce_bench)
if [ "${tree}" = "${build}/full" ]; then
  # The worker's GPU path: device buffers, and collectives of ranks on
  # Cuda(0) through a real coordinator and workers.
  targets+=(device_buffers_test gpu_collectives_test chorus-coordinator
            chorus-worker chorusctl chorus-bench)
fi
if [ -z "${prebuilt}" ] &&
   ! timeout 360 ninja -C "${tree}" -j "${jobs}" "${targets[@]}" \
     >>"${log}" 2>&1; then
  tail -n 40 "${log}"
  say "build failed (full log: ${log})"
  exit 1
fi
built=$(date +%s)

# ---- GPU tests ---------------------------------------------------------------
# Prebuilt: the test programs at once (one GPU, many cores), the
# collectives test one process per case as ctest runs it, each with its own
# time limit, summarised in ctest's line format for the table.
run_prebuilt_tests() {
  local program name filter i=0 rc=0 units=()
  for program in "${packed_tests[@]}"; do
    case "${program}" in
      device_buffers_test) units+=("${program}:-*MissingGpu*") ;;
      gpu_collectives_test)
        while read -r name; do units+=("${program}:${name}"); done < <(
          "${tree}/${program}" --gtest_list_tests |
            awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}') ;;
      *) units+=("${program}:*") ;;
    esac
  done
  for unit in "${units[@]}"; do
    ( program="${unit%%:*}" filter="${unit#*:}" t0=$(date +%s)
      timeout 420 "${tree}/${program}" --gtest_filter="${filter}" \
        >"${build}/${i}.log" 2>&1
      echo "$? $(( $(date +%s) - t0 ))" >"${build}/${i}.rc" ) &
    i=$((i + 1))
  done
  wait
  i=0
  for unit in "${units[@]}"; do
    name="${unit%%:*}"
    [ "${unit#*:}" = '*' ] || [ "${unit#*:}" = '-*MissingGpu*' ] ||
      name="${unit#*:}"
    read -r code secs <"${build}/${i}.rc" && rm -f "${build}/${i}.rc"
    mv "${build}/${i}.log" "${build}/${name}.log"
    i=$((i + 1))
    local verdict="Passed"
    if [ "${code}" != 0 ]; then
      verdict="***Failed (exit ${code})"; rc=1
      tail -n 40 "${build}/${name}.log"
    elif grep -q '^\[  SKIPPED \]' "${build}/${name}.log"; then
      verdict="Skipped"
    fi
    printf '%d/%d Test #%d: %s ... %s %s sec\n' "${i}" \
      "${#units[@]}" "${i}" "${name}" "${verdict}" "${secs}"
    [ "${verdict}" = Skipped ] && echo "  (Skipped)"
    grep -E '^\[  (PASSED|FAILED) +\]|per call' "${build}/${name}.log" |
      sed 's/^/  | /'
  done
  return ${rc}
}
if [ -n "${prebuilt}" ]; then
  test_out="$(run_prebuilt_tests 2>&1)"
else
  # Each test has its own time limit (ctest reports it by name); the
  # outer one only stops a ctest that hangs as a whole.
  test_out="$(timeout 1500 ctest --test-dir "${tree}" -L gpu --timeout 420 \
              --output-on-failure 2>&1)"
fi
test_rc=$?
printf '%s\n' "${test_out}" >>"${log}"
if [ ${test_rc} -ne 0 ]; then
  tests="FAILED (exit ${test_rc})"
  printf '%s\n' "${test_out}" | tail -n 60
elif printf '%s' "${test_out}" | grep -q '(Skipped)'; then
  # A GPU is installed but the test process could not use it: say why.
  test_bin="$(find_binary gpu_reduce_test)"
  reason="$("${test_bin}" --gtest_filter='GpuReduceTypedTest/0.*' 2>&1 |
            grep -m1 -E 'no usable CUDA device|built without CUDA')"
  tests="SKIPPED, not run: ${reason:-see ${log}}"
  test_rc=1
else
  tests="PASSED"
fi
tested=$(date +%s)

# ---- Bandwidth benchmark ------------------------------------------------------
bench_bin="$(find_binary gpu_reduce_bench)"
bench_out="$(timeout 120 "${bench_bin}" --mib="${mib}" --iters="${iters}" 2>&1)"
bench_rc=$?
[ ${bench_rc} -eq 0 ] || bench_out="${bench_out}
(benchmark exit status ${bench_rc})"
printf '%s\n' "${bench_out}" >>"${log}"
finished=$(date +%s)

# ---- The same all-reduce with buffers on the CPU and on the GPU ----------------
# chorus-bench, 2 ranks (one process each; both on GPU 0 of a one-GPU
# machine), all_reduce f32 sum: --device=cpu against --device=cuda (buffers
# in GPU memory by pointer, reduced there), run back to back, with the
# ratio of their times per size (below 1: the GPU path is faster).
run_cpu_vs_gpu() {
  local bench_bin out_cpu out_gpu
  bench_bin="$(find_binary chorus-bench)"
  if [ -z "${bench_bin}" ]; then
    echo "  not run: chorus-bench was not built (${mode})"
    return 0
  fi
  local args=(--ranks=2 --min_bytes=1M --max_bytes=64M --step_factor=8
              --time_per_size=1s --format=csv --timeout=60s)
  [ -z "${prebuilt}" ] ||
    args+=(--coordinator_bin="${tree}/chorus-coordinator")
  out_cpu="$(timeout 120 "${bench_bin}" "${args[@]}" --device=cpu 2>>"${log}")"
  local cpu_rc=$?
  out_gpu="$(timeout 120 "${bench_bin}" "${args[@]}" --device=cuda 2>>"${log}")"
  local gpu_rc=$?
  printf '%s\n%s\n' "${out_cpu}" "${out_gpu}" >>"${log}"
  printf '  %10s %14s %14s %9s %s\n' bytes "cpu us" "gpu us" gpu/cpu "plan (gpu)"
  join -t, <(printf '%s\n' "${out_cpu}" | awk -F, '$1 ~ /^[0-9]+$/' | sort -t, -k1,1) \
           <(printf '%s\n' "${out_gpu}" | awk -F, '$1 ~ /^[0-9]+$/' | sort -t, -k1,1) |
    sort -t, -k1,1n |
    awk -F, '{ printf "  %10s %14s %14s %9.2f %s%s\n", $1, $5, $16, $16 / $5, $14,
               ($12 + $23 > 0 ? "  WRONG RESULTS" : "") }'
  [ ${cpu_rc} -eq 0 ] || echo "  --device=cpu failed (exit ${cpu_rc}; see ${log})"
  [ ${gpu_rc} -eq 0 ] || echo "  --device=cuda failed (exit ${gpu_rc}; see ${log})"
  [ ${cpu_rc} -eq 0 ] && [ ${gpu_rc} -eq 0 ]
}
cpu_vs_gpu_out="$(run_cpu_vs_gpu)"
cpu_vs_gpu_rc=$?
compared=$(date +%s)

# ---- torch on GPUs --------------------------------------------------------------
# The chorus torch backend with CUDA tensors (tests/python, marked gpu:
# collectives on daemon ranks, DDP of examples/python/ddp_train.py --device
# cuda), where /usr/bin/python3 has torch with CUDA and the daemons exist.
run_torch_tests() {
  # Prebuilt: the packed folder of binaries; else the build tree.
  local where=(CHORUS_BUILD_DIR="${tree}") daemons="${tree}/server/worker"
  [ -z "${prebuilt}" ] || { where=(CHORUS_BIN_DIR="${tree}"); daemons="${tree}"; }
  if ! /usr/bin/python3 -c 'import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)' >>"${log}" 2>&1; then
    echo "not run: /usr/bin/python3 has no torch that sees a GPU"
    return 0
  fi
  if [ ! -x "${daemons}/chorus-worker" ]; then
    echo "not run: the daemons were not built (${mode})"
    return 0
  fi
  rm -rf "${build}/python"
  if ! timeout 300 /usr/bin/python3 -m pip install --quiet --no-deps \
       --no-build-isolation --no-index --target "${build}/python" \
       --break-system-packages "${root}/client/python" >>"${log}" 2>&1; then
    echo "FAILED: the chorus package did not install (see ${log})"
    return 1
  fi
  local out
  out="$(cd "${root}/tests/python" && env PYTHONPATH="${build}/python" \
         "${where[@]}" timeout 600 /usr/bin/python3 -m pytest \
         -q -m gpu -p no:cacheprovider 2>&1)"
  local rc=$?
  printf '%s\n' "${out}" >>"${log}"
  [ ${rc} -eq 0 ] || printf '%s\n' "${out}" | tail -n 40 >&2
  echo "$([ ${rc} -eq 0 ] && echo PASSED || echo "FAILED (exit ${rc})"):" \
       "$(printf '%s\n' "${out}" | tail -n 1)"
  return ${rc}
}
torch_line="$(run_torch_tests)"
torch_rc=$?
torched=$(date +%s)

# ---- One table ----------------------------------------------------------------
echo
echo "== Chorus reduce engine GPU check =========================================="
printf '%-12s %s\n' "GPU" "${gpu_name}"
[ -z "${gpus_table}" ] || printf '%s\n' "${gpus_table}"
printf '%-12s %s\n' "build" "${mode}: ${tree} ($((built - started)) s)"
printf '%-12s %s\n' "gpu tests" "${tests} ($((tested - built)) s)"
printf '%s\n' "${test_out}" | grep -E '^ *[0-9]+/[0-9]+ Test|^  [|] ' |
  sed 's/^/  /'
printf '%-12s %s\n' "torch" "${torch_line} ($((torched - compared)) s)"
printf '%-12s %s\n' "cpu vs gpu" "chorus-bench all_reduce f32, 2 ranks ($((compared - finished)) s)"
printf '%s\n' "${cpu_vs_gpu_out}"
printf '%-12s %s\n' "bench" "dst = op(dst, src) moves 3 x bytes; memcpy and finalize 2 x ($((finished - tested)) s)"
echo "-----------------------------------------------------------------------------"
printf '%s\n' "${bench_out}"
echo "============================================================================="
exit $(( test_rc == 0 && torch_rc == 0 && cpu_vs_gpu_rc == 0 ? 0 : 1 ))
