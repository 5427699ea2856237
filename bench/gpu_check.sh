#!/usr/bin/env bash
# GPU check for Chorus. On a machine with an NVIDIA GPU and the repository:
# builds only what the check needs (cmake + ninja): the CUDA reduce targets,
# and where the full project configures, the worker's GPU path tests and the
# daemons they start; runs the tests labelled gpu (kernels against the CPU
# engine, device buffers, all-reduce of 2 and 4 ranks on GPU 0, mixed
# Cpu/Cuda groups, GPU memory by pointer, ranks through daemons), runs the
# kernel bandwidth benchmark, and prints one table. Without a GPU it says so
# and exits 0. Meant to finish within 5 minutes (the full project's build is
# most of it).
#
# Usage: bench/gpu_check.sh [build-dir]     (default: <repo>/build-gpu-check)
# Environment: JOBS (default: nproc), BENCH_MIB (256), BENCH_ITERS (20),
# GPU_CHECK_STANDALONE=1 to skip the full project and build bench/gpu_check.
# Exit status: 0 when the GPU tests pass (or there is no GPU), 1 otherwise.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${root}/build-gpu-check}"
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

# ---- Toolchain --------------------------------------------------------------
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:${PATH}"
  else
    say "a GPU is present (${gpu_name}) but no CUDA toolkit: nvcc is neither" \
        "on PATH nor in /usr/local/cuda/bin"
    exit 1
  fi
fi
for tool in cmake ninja; do
  if ! command -v "${tool}" >/dev/null 2>&1; then
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
if [ "${GPU_CHECK_STANDALONE:-0}" = 1 ] ||
   ! cmake -S "${root}" -B "${build}/full" -G Ninja \
     -DCMAKE_BUILD_TYPE=Release -DCHORUS_CUDA=ON >>"${log}" 2>&1; then
  mode="standalone (bench/gpu_check)"
  [ "${GPU_CHECK_STANDALONE:-0}" = 1 ] ||
    say "the full project does not configure here (see ${log});" \
        "using the standalone reduce build"
  if ! cmake -S "${root}/bench/gpu_check" -B "${build}/standalone" -G Ninja \
       -DCMAKE_BUILD_TYPE=Release >>"${log}" 2>&1; then
    tail -n 30 "${log}"
    say "configure failed"
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
            chorus-worker)
fi
if ! timeout 360 ninja -C "${tree}" -j "${jobs}" "${targets[@]}" \
     >>"${log}" 2>&1; then
  tail -n 40 "${log}"
  say "build failed (full log: ${log})"
  exit 1
fi
built=$(date +%s)

# ---- GPU tests ---------------------------------------------------------------
test_out="$(timeout 300 ctest --test-dir "${tree}" -L gpu --output-on-failure \
            2>&1)"
test_rc=$?
printf '%s\n' "${test_out}" >>"${log}"
if [ ${test_rc} -ne 0 ]; then
  tests="FAILED (ctest exit ${test_rc})"
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

# ---- One table ----------------------------------------------------------------
echo
echo "== Chorus reduce engine GPU check =========================================="
printf '%-12s %s\n' "GPU" "${gpu_name}"
printf '%-12s %s\n' "build" "${mode}: ${tree} ($((built - started)) s)"
printf '%-12s %s\n' "gpu tests" "${tests} ($((tested - built)) s)"
printf '%s\n' "${test_out}" | grep -E '^ *[0-9]+/[0-9]+ Test' | sed 's/^/  /'
printf '%-12s %s\n' "bench" "dst = op(dst, src) moves 3 x bytes; memcpy and finalize 2 x ($((finished - tested)) s)"
echo "-----------------------------------------------------------------------------"
printf '%s\n' "${bench_out}"
echo "============================================================================="
exit $(( test_rc == 0 ? 0 : 1 ))
