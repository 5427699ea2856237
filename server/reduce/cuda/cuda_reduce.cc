#include "server/reduce/cuda/cuda_reduce.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/reduce/cuda/cuda_status.h"
#include "server/reduce/cuda/reduce_launch.h"
#include "server/reduce/reduce_args.h"

namespace chorus {
namespace cuda_reduce {
namespace {

std::string DeviceName(int device) { return CudaDeviceName(device); }

absl::Status WithDevice(int device, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(DeviceName(device), ": ", status.message()));
}

absl::Status CheckStream(int device, cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy ||
      stream == cudaStreamPerThread) {
    return absl::InvalidArgumentError(absl::StrCat(
        DeviceName(device),
        ": the default stream is refused; pass a stream of this device"));
  }
  return absl::OkStatus();
}

// Returns how many blocks a launch may use on `device`: enough to fill it.
absl::Status MaxBlocks(int device, int* max_blocks) {
  int sms = 0;
  if (cudaError_t e =
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess) {
    return CudaError(device, e, "querying the multiprocessor count");
  }
  // 2048 resident threads per SM on sm_80 and sm_90, 256 per block.
  *max_blocks = sms > 0 ? sms * 8 : 1;
  return absl::OkStatus();
}

// Runs `launch(max_blocks)` on `device` and reports its launch error.
template <typename Launch>
absl::Status LaunchOn(int device, absl::string_view what, Launch launch) {
  ScopedDevice scope;
  if (absl::Status s = scope.Enter(device); !s.ok()) return s;
  int max_blocks = 1;
  if (absl::Status s = MaxBlocks(device, &max_blocks); !s.ok()) return s;
  // Clear an error left by an earlier call on this thread, so the check
  // after the launch reports this launch only.
  cudaGetLastError();
  if (!launch(max_blocks)) {
    return absl::InternalError(
        absl::StrCat(DeviceName(device), ": no kernel for ", what));
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    return CudaError(device, e,
                     absl::StrCat("launching the ", what, " kernel"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReduceInto(int device, ReduceOp op, DType dtype, void* dst,
                        const void* src, size_t count, cudaStream_t stream) {
  return Reduce(device, op, dtype, dst, dst, src, count, stream);
}

absl::Status Reduce(int device, ReduceOp op, DType dtype, void* dst,
                    const void* a, const void* b, size_t count,
                    cudaStream_t stream) {
  if (absl::Status s = reduce::ValidateReduceArgs(op, dtype, dst, a, b, count);
      !s.ok()) {
    return WithDevice(device, s);
  }
  if (absl::Status s = CheckStream(device, stream); !s.ok()) return s;
  if (count == 0) return absl::OkStatus();
  using LaunchFn = bool (*)(DType, void*, const void*, const void*, size_t, int,
                            cudaStream_t);
  LaunchFn launch_fn = nullptr;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      launch_fn = internal::LaunchSum;
      break;
    case ReduceOp::kProd:
      launch_fn = internal::LaunchProd;
      break;
    case ReduceOp::kMin:
      launch_fn = internal::LaunchMin;
      break;
    case ReduceOp::kMax:
      launch_fn = internal::LaunchMax;
      break;
    case ReduceOp::kUnspecified:
      break;
  }
  if (launch_fn == nullptr) {  // Unreachable after validation.
    return WithDevice(device, ValidateReduceOp(op));
  }
  const std::string what =
      absl::StrCat(ReduceOpName(op), " ", DTypeName(dtype));
  return LaunchOn(device, what, [&](int max_blocks) {
    return launch_fn(dtype, dst, a, b, count, max_blocks, stream);
  });
}

absl::Status FinalizeAvg(int device, DType dtype, void* data, size_t count,
                         int world_size, cudaStream_t stream) {
  if (absl::Status s =
          reduce::ValidateFinalizeArgs(dtype, data, count, world_size);
      !s.ok()) {
    return WithDevice(device, s);
  }
  if (absl::Status s = CheckStream(device, stream); !s.ok()) return s;
  if (count == 0 || world_size == 1) return absl::OkStatus();
  const std::string what = absl::StrCat("avg finalize ", DTypeName(dtype));
  return LaunchOn(device, what, [&](int max_blocks) {
    return internal::LaunchFinalizeAvg(dtype, data, count, world_size,
                                       max_blocks, stream);
  });
}

}  // namespace cuda_reduce
}  // namespace chorus
