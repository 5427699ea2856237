// The NcclRuntime of a build with CUDA and NCCL. Communicators are
// non-blocking (ncclConfig_t.blocking = 0): making one returns at once and
// CommReady() polls ncclCommGetAsyncError, and an abort from another thread
// ends a communicator that still connects or waits for a peer.
#include <nccl.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/reduce/cuda/cuda_status.h"
#include "server/worker/gpu/nccl_runtime.h"

namespace chorus {
namespace {

using cuda_reduce::ScopedDevice;

struct NcclComm {
  ncclComm_t comm = nullptr;
  int device = 0;
};

NcclComm* AsNccl(NcclRuntime::Comm comm) {
  return reinterpret_cast<NcclComm*>(comm);
}

// `result` as a status naming `device` and what was being done.
absl::Status NcclError(int device, ncclResult_t result,
                       absl::string_view doing) {
  const std::string message =
      absl::StrCat(DeviceRuntime::Name(device), ": ", doing,
                   ": NCCL: ", ncclGetErrorString(result), " (",
                   ncclGetLastError(nullptr), ")");
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// NCCL's type of `dtype`; false for none.
bool NcclType(DType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DType::kF16:
      *out = ncclFloat16;
      return true;
    case DType::kBF16:
      *out = ncclBfloat16;
      return true;
    case DType::kF32:
      *out = ncclFloat32;
      return true;
    case DType::kF64:
      *out = ncclFloat64;
      return true;
    case DType::kI8:
      *out = ncclInt8;
      return true;
    case DType::kU8:
      *out = ncclUint8;
      return true;
    case DType::kI32:
      *out = ncclInt32;
      return true;
    case DType::kU32:
      *out = ncclUint32;
      return true;
    case DType::kI64:
      *out = ncclInt64;
      return true;
    case DType::kU64:
      *out = ncclUint64;
      return true;
    default:
      return false;
  }
}

bool NcclOp(ReduceOp op, ncclRedOp_t* out) {
  switch (op) {
    case ReduceOp::kSum:
      *out = ncclSum;
      return true;
    case ReduceOp::kProd:
      *out = ncclProd;
      return true;
    case ReduceOp::kMin:
      *out = ncclMin;
      return true;
    case ReduceOp::kMax:
      *out = ncclMax;
      return true;
    default:
      return false;
  }
}

// How often an enqueue looks whether NCCL connected to its peers (a
// non-blocking communicator connects on its first collectives and offers
// no notification).
constexpr absl::Duration kEnqueuePoll = absl::Milliseconds(1);

class BuiltNcclRuntime final : public NcclRuntime {
 public:
  int version() const override {
    int version = 0;
    return ncclGetVersion(&version) == ncclSuccess ? version : 0;
  }

  absl::StatusOr<std::string> NewId() override {
    ncclUniqueId id;
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(-1, r, "making an NCCL unique id");
    }
    static_assert(sizeof(id.internal) == kIdBytes);
    return std::string(id.internal, sizeof(id.internal));
  }

  absl::StatusOr<Comm> StartComm(int device, absl::string_view id, int world,
                                 int rank) override {
    if (id.size() != kIdBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(DeviceRuntime::Name(device), ": an NCCL id of ",
                       id.size(), " bytes (", kIdBytes, " expected)"));
    }
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    ncclUniqueId unique;
    std::memcpy(unique.internal, id.data(), kIdBytes);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    auto* made = new NcclComm{nullptr, device};
    ncclResult_t r =
        ncclCommInitRankConfig(&made->comm, world, unique, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (made->comm != nullptr) ncclCommAbort(made->comm);
      delete made;
      return NcclError(device, r, "making an NCCL communicator");
    }
    return reinterpret_cast<Comm>(made);
  }

  absl::StatusOr<bool> CommReady(Comm comm) override {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(AsNccl(comm)->comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) {
      return NcclError(AsNccl(comm)->device, state,
                       "connecting the NCCL communicator");
    }
    return true;
  }

  absl::Status Enqueue(Comm comm, const CollectiveSpec& spec, const void* input,
                       void* output, DeviceRuntime::Stream stream,
                       absl::Time until) override {
    const NcclComm& c = *AsNccl(comm);
    ncclDataType_t type;
    ncclRedOp_t op = ncclSum;
    const bool reduces = spec.kind == CollectiveKind::kAllReduce ||
                         spec.kind == CollectiveKind::kReduce ||
                         spec.kind == CollectiveKind::kReduceScatter;
    if (!NcclRunsSpec(spec) || !NcclType(spec.dtype, &type) ||
        (reduces && !NcclOp(spec.op, &op))) {
      return absl::InvalidArgumentError(
          absl::StrCat(DeviceRuntime::Name(c.device), ": NCCL does not run ",
                       CollectiveKindName(spec.kind), " of ",
                       DTypeName(spec.dtype), " as Chorus defines it"));
    }
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(c.device); !s.ok()) return s;
    auto cuda = reinterpret_cast<cudaStream_t>(stream);
    ncclResult_t r = ncclInternalError;
    switch (spec.kind) {
      case CollectiveKind::kAllReduce:
        r = ncclAllReduce(input, output, spec.count, type, op, c.comm, cuda);
        break;
      case CollectiveKind::kReduce:
        r = ncclReduce(input, output, spec.count, type, op, spec.root, c.comm,
                       cuda);
        break;
      case CollectiveKind::kBroadcast:
        r = ncclBroadcast(input, output, spec.count, type, spec.root, c.comm,
                          cuda);
        break;
      case CollectiveKind::kAllGather:
        r = ncclAllGather(input, output, spec.count, type, c.comm, cuda);
        break;
      case CollectiveKind::kReduceScatter:
        r = ncclReduceScatter(input, output, spec.count, type, op, c.comm,
                              cuda);
        break;
      default:
        break;
    }
    return Enqueued(c, r, spec, until);
  }

  void Abort(Comm comm) override {
    ncclCommAbort(AsNccl(comm)->comm);
    delete AsNccl(comm);
  }

 private:
  // What an enqueue's result `r` means: a non-blocking communicator says
  // ncclInProgress while it connects to its peers, and the call is
  // enqueued once that ends.
  static absl::Status Enqueued(const NcclComm& c, ncclResult_t r,
                               const CollectiveSpec& spec, absl::Time until) {
    const std::string doing =
        absl::StrCat("enqueueing ", CollectiveKindName(spec.kind), " on NCCL");
    while (r == ncclInProgress && absl::Now() < until) {
      absl::SleepFor(kEnqueuePoll);
      if (ncclCommGetAsyncError(c.comm, &r) != ncclSuccess) {
        r = ncclInternalError;
      }
    }
    if (r == ncclInProgress) {
      return absl::DeadlineExceededError(
          absl::StrCat(DeviceRuntime::Name(c.device), ": ", doing,
                       ": NCCL still connecting to its peers at the "
                       "deadline"));
    }
    return r == ncclSuccess ? absl::OkStatus() : NcclError(c.device, r, doing);
  }
};

}  // namespace

NcclRuntime* BuiltInNcclRuntime() {
  static BuiltNcclRuntime* const runtime = new BuiltNcclRuntime();
  return runtime;
}

}  // namespace chorus
