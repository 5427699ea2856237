#include "server/worker/local/chunked_call_reactor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "server/worker/local/grpc_deadline.h"

namespace chorus {

ChunkedCallReactor::ChunkedCallReactor(LocalCalls* calls,
                                       grpc::CallbackServerContext* context)
    : calls_(calls), context_(context) {
  StartRead(&request_);
}

void ChunkedCallReactor::OnReadDone(bool ok) {
  absl::Status status;
  bool run = false;
  {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      // The client half-closed, or the stream broke.
      if (context_->IsCancelled()) {
        status = absl::CancelledError("the client cancelled the stream");
      } else {
        status = InputComplete();
        run = status.ok();
      }
    } else if (request_.part_case() == v1::LocalChunkedRequest::kHeader) {
      status = phase_ == Phase::kHeader
                   ? TakeHeader(request_.header())
                   : absl::InvalidArgumentError(
                         "CollectiveChunked got a second header; a stream "
                         "carries one call: one header, then the input's "
                         "pieces");
    } else if (request_.part_case() == v1::LocalChunkedRequest::kData) {
      status = phase_ == Phase::kInput
                   ? TakePiece(request_.data())
                   : absl::InvalidArgumentError(
                         "CollectiveChunked got a piece of data before the "
                         "header; the first message must be the header");
    } else {
      status = absl::InvalidArgumentError(
          "CollectiveChunked got a message with neither a header nor data");
    }
    if (!status.ok() && !MarkFinished()) return;
  }
  if (!status.ok()) {
    Finish(ToGrpcStatus(status));
  } else if (run) {
    StartRun();
  } else {
    StartRead(&request_);
  }
}

absl::Status ChunkedCallReactor::TakeHeader(
    const v1::LocalChunkedHeader& header) {
  absl::StatusOr<LocalCall> call =
      calls_->PrepareStreamed(header.call(), header.input_bytes());
  if (!call.ok()) return call.status();
  call_ = *std::move(call);
  input_bytes_ = header.input_bytes();
  input_.reserve(input_bytes_);
  phase_ = Phase::kInput;
  return absl::OkStatus();
}

absl::Status ChunkedCallReactor::TakePiece(const std::string& piece) {
  if (piece.size() > kMaxPieceBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CollectiveChunked: a piece of ", piece.size(),
        " bytes is over the limit of ", kMaxPieceBytes, " bytes per piece"));
  }
  if (piece.size() > input_bytes_ - input_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CollectiveChunked: the pieces add up to ",
        input_.size() + piece.size(),
        " bytes, past the header's input_bytes of ", input_bytes_));
  }
  input_.append(piece);
  return absl::OkStatus();
}

absl::Status ChunkedCallReactor::InputComplete() const {
  if (phase_ == Phase::kHeader) {
    return absl::InvalidArgumentError(
        "CollectiveChunked: the stream ended before its header");
  }
  if (input_.size() != input_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CollectiveChunked: the stream ended after ",
                     input_.size(), " of ", input_bytes_, " bytes of input"));
  }
  return absl::OkStatus();
}

void ChunkedCallReactor::StartRun() {
  LocalCall call;
  absl::string_view input;
  std::string* output;
  {
    absl::MutexLock lock(&mu_);
    phase_ = Phase::kRunning;
    call = std::move(call_);
    input = input_;
    output = &output_;
  }
  calls_->RunPrepared(
      std::move(call), CallDeadline(*context_), input, output,
      [this](absl::StatusOr<RunResult> result, KeepOutput keep) {
        Ran(std::move(result), std::move(keep));
      });
}

void ChunkedCallReactor::Ran(absl::StatusOr<RunResult> result,
                             KeepOutput keep) {
  {
    absl::MutexLock lock(&mu_);
    keep_ = std::move(keep);
    std::string().swap(input_);
    if (result.ok()) {
      phase_ = Phase::kOutput;
      v1::LocalChunkedResult* header = response_.mutable_header();
      header->set_sequence(result->sequence);
      ToPlanProto(*result, header->mutable_plan());
      header->set_output_bytes(output_.size());
    } else if (!MarkFinished()) {
      return;
    }
  }
  if (result.ok()) {
    StartWrite(&response_);
  } else {
    Finish(ToGrpcStatus(result.status()));
  }
}

void ChunkedCallReactor::OnWriteDone(bool ok) {
  absl::Status status;  // to finish with when nothing is left to write
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      status = absl::CancelledError(
          "CollectiveChunked: the stream broke while the result was sent");
    } else {
      write = NextPiece();
    }
    if (!write && !MarkFinished()) return;
  }
  if (write) {
    StartWrite(&response_);
  } else {
    Finish(ToGrpcStatus(status));
  }
}

bool ChunkedCallReactor::NextPiece() {
  if (written_ == output_.size()) return false;
  const uint64_t n =
      std::min<uint64_t>(kMaxPieceBytes, output_.size() - written_);
  response_.set_data(output_.data() + written_, n);
  written_ += n;
  return true;
}

bool ChunkedCallReactor::MarkFinished() {
  if (phase_ == Phase::kFinished) return false;
  phase_ = Phase::kFinished;
  std::string().swap(input_);
  return true;
}

void ChunkedCallReactor::OnDone() {
  KeepOutput keep;
  std::string output;
  {
    absl::MutexLock lock(&mu_);
    keep = std::move(keep_);
    output = std::move(output_);
  }
  if (keep) keep(std::move(output));
  delete this;
}

}  // namespace chorus
