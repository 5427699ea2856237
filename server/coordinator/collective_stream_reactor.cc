#include "server/coordinator/collective_stream_reactor.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/grpc_status.h"
#include "server/coordinator/collective_proto.h"

namespace chorus {

CollectiveStreamReactor::CollectiveStreamReactor(CollectiveStreamHost* host)
    : host_(host) {
  StartRead(&request_);
}

void CollectiveStreamReactor::OnReadDone(bool ok) {
  grpc::Status finish_status;
  if (!ok) {
    // The client half-closed, or the stream broke.
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      finish = ShouldFinishLocked(&finish_status);
    }
    if (finish) Finish(finish_status);
    return;
  }
  v1::CollectiveStreamRequest request = std::move(request_);
  request_.Clear();
  {
    absl::MutexLock lock(&mu_);
    if (ending_ || finished_) return;
    ++pending_;
  }
  // The next read starts once this request is in the group table, so a
  // stream's calls are taken in the order the client sent them.
  struct ReadNext {
    CollectiveStreamReactor* reactor;
    ~ReadNext() { reactor->StartRead(&reactor->request_); }
  } read_next{this};
  StartStreamedCall(*host_, request, [this](v1::CollectiveStreamReply reply) {
    Reply(std::move(reply));
  });
}

void CollectiveStreamReactor::Reply(v1::CollectiveStreamReply reply) {
  const v1::CollectiveStreamReply* write = nullptr;
  grpc::Status finish_status;
  bool finish = false;
  bool destroy = false;
  {
    absl::MutexLock lock(&mu_);
    --pending_;
    if (!ending_ && !finished_) {
      replies_.push_back(std::move(reply));
      if (!writing_) {
        writing_ = true;
        write = &replies_.front();
      }
    }
    finish = ShouldFinishLocked(&finish_status);
    destroy = done_ && pending_ == 0 && holds_ == 0;
  }
  // A deque keeps its elements in place while others are appended.
  if (write != nullptr) StartWrite(write);
  if (finish) Finish(finish_status);
  if (destroy) delete this;
}

void CollectiveStreamReactor::OnWriteDone(bool ok) {
  const v1::CollectiveStreamReply* write = nullptr;
  grpc::Status finish_status;
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    replies_.pop_front();
    if (!ok) {
      // The stream broke: nothing more can be written.
      replies_.clear();
      if (!ending_) {
        ending_ = true;
        end_status_ = absl::CancelledError("the collective stream broke");
      }
    }
    if (!replies_.empty()) {
      write = &replies_.front();
    } else {
      writing_ = false;
      finish = ShouldFinishLocked(&finish_status);
    }
  }
  if (write != nullptr) StartWrite(write);
  if (finish) Finish(finish_status);
}

void CollectiveStreamReactor::OnCancel() {
  End(absl::CancelledError("the collective stream was cancelled"));
}

void CollectiveStreamReactor::End(const absl::Status& status) {
  grpc::Status finish_status;
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || ending_) return;
    ending_ = true;
    end_status_ = status;
    finish = ShouldFinishLocked(&finish_status);
  }
  if (finish) Finish(finish_status);
}

bool CollectiveStreamReactor::ShouldFinishLocked(grpc::Status* status) {
  if (finished_ || writing_) return false;
  if (ending_) {
    *status = ToGrpcStatus(end_status_);
  } else if (reads_done_ && pending_ == 0) {
    *status = grpc::Status::OK;
  } else {
    return false;
  }
  finished_ = true;
  return true;
}

void CollectiveStreamReactor::Hold() {
  absl::MutexLock lock(&mu_);
  ++holds_;
}

void CollectiveStreamReactor::Release() {
  bool destroy = false;
  {
    absl::MutexLock lock(&mu_);
    --holds_;
    destroy = done_ && pending_ == 0 && holds_ == 0;
  }
  if (destroy) delete this;
}

void CollectiveStreamReactor::OnDone() {
  host_->StreamDone(this);
  bool destroy = false;
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    destroy = pending_ == 0 && holds_ == 0;
  }
  if (destroy) delete this;
}

}  // namespace chorus
