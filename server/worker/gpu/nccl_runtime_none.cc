// The NcclRuntime of a build without NCCL: version 0, and every operation
// says so.
#include "server/worker/gpu/nccl_runtime.h"

namespace chorus {
namespace {

absl::Status NoNccl() {
  return absl::UnimplementedError("this worker was built without NCCL");
}

class NoNcclRuntime final : public NcclRuntime {
 public:
  int version() const override { return 0; }
  absl::StatusOr<std::string> NewId() override { return NoNccl(); }
  absl::StatusOr<Comm> StartComm(int, absl::string_view, int, int) override {
    return NoNccl();
  }
  absl::StatusOr<bool> CommReady(Comm) override { return NoNccl(); }
  absl::Status Enqueue(Comm, const CollectiveSpec&, const void*, void*,
                       DeviceRuntime::Stream, absl::Time) override {
    return NoNccl();
  }
  void Abort(Comm) override {}
};

}  // namespace

NcclRuntime* BuiltInNcclRuntime() {
  static NoNcclRuntime* const runtime = new NoNcclRuntime();
  return runtime;
}

}  // namespace chorus
