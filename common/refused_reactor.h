// Reactors for streaming calls a callback service refuses before reading
// anything: the call ends at once with the given status.
//
// Lifecycle: make one with new and return it from the service method; it
// deletes itself when gRPC is done with it. Thread-compatible.
#ifndef CHORUS_COMMON_REFUSED_REACTOR_H_
#define CHORUS_COMMON_REFUSED_REACTOR_H_

#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

namespace chorus {

// `Reactor` is a grpc::ServerReadReactor<T>, grpc::ServerWriteReactor<T> or
// grpc::ServerBidiReactor<Q, R>.
template <typename Reactor>
class RefusedReactor final : public Reactor {
 public:
  explicit RefusedReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace chorus

#endif  // CHORUS_COMMON_REFUSED_REACTOR_H_
