#include "server/worker/chunked_call_reactor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/grpc_status.h"

namespace chorus {

ChunkedCallReactor::ChunkedCallReactor(LocalApiService* service,
                                       grpc::CallbackServerContext* context)
    : service_(service), context_(context) {
  StartRead(&request_);
}

void ChunkedCallReactor::OnReadDone(bool ok) {
  if (!ok) {
    // The client half-closed, or the stream broke.
    if (context_->IsCancelled()) {
      End(absl::CancelledError("the client cancelled the stream"));
    } else {
      EndOfInput();
    }
    return;
  }
  switch (request_.part_case()) {
    case v1::LocalChunkedRequest::kHeader:
      if (phase_ != Phase::kHeader) {
        End(absl::InvalidArgumentError(
            "CollectiveChunked got a second header; a stream carries one "
            "call: one header, then the input's pieces"));
        return;
      }
      TakeHeader(request_.header());
      break;
    case v1::LocalChunkedRequest::kData:
      if (phase_ != Phase::kInput) {
        End(absl::InvalidArgumentError(
            "CollectiveChunked got a piece of data before the header; the "
            "first message must be the header"));
        return;
      }
      TakePiece(request_.data());
      break;
    default:
      End(absl::InvalidArgumentError(
          "CollectiveChunked got a message with neither a header nor data"));
      return;
  }
  if (phase_ == Phase::kInput) StartRead(&request_);
}

void ChunkedCallReactor::TakeHeader(const v1::LocalChunkedHeader& header) {
  if (!header.call().data().empty()) {
    End(absl::InvalidArgumentError(absl::StrCat(
        "CollectiveChunked: the header's call carries ",
        header.call().data().size(),
        " bytes of data; send the input in data pieces after the header")));
    return;
  }
  absl::StatusOr<LocalCall> call = service_->PrepareCall(header.call());
  absl::Status status = call.status();
  if (status.ok()) status = service_->CheckSizes(*call, header.input_bytes());
  if (!status.ok()) {
    End(status);
    return;
  }
  call_ = *std::move(call);
  input_bytes_ = header.input_bytes();
  input_.reserve(input_bytes_);
  phase_ = Phase::kInput;
}

void ChunkedCallReactor::TakePiece(const std::string& piece) {
  if (piece.size() > kMaxPieceBytes) {
    End(absl::InvalidArgumentError(absl::StrCat(
        "CollectiveChunked: a piece of ", piece.size(),
        " bytes is over the limit of ", kMaxPieceBytes, " bytes per piece")));
    return;
  }
  if (piece.size() > input_bytes_ - input_.size()) {
    End(absl::InvalidArgumentError(absl::StrCat(
        "CollectiveChunked: the pieces add up to ",
        input_.size() + piece.size(),
        " bytes, past the header's input_bytes of ", input_bytes_)));
    return;
  }
  input_.append(piece);
}

void ChunkedCallReactor::EndOfInput() {
  if (phase_ == Phase::kHeader) {
    End(absl::InvalidArgumentError(
        "CollectiveChunked: the stream ended before its header"));
    return;
  }
  if (input_.size() != input_bytes_) {
    End(absl::InvalidArgumentError(
        absl::StrCat("CollectiveChunked: the stream ended after ",
                     input_.size(), " of ", input_bytes_, " bytes of input")));
    return;
  }
  phase_ = Phase::kRunning;
  service_->StartCall(
      std::move(call_), *context_, input_, &output_,
      [this](absl::StatusOr<RunResult> result) { Ran(std::move(result)); });
}

void ChunkedCallReactor::Ran(absl::StatusOr<RunResult> result) {
  std::string().swap(input_);
  if (!result.ok()) {
    End(result.status());
    return;
  }
  phase_ = Phase::kOutput;
  v1::LocalChunkedResult* header = response_.mutable_header();
  header->set_sequence(result->sequence);
  ToPlanProto(*result, header->mutable_plan());
  header->set_output_bytes(output_.size());
  StartWrite(&response_);
}

void ChunkedCallReactor::OnWriteDone(bool ok) {
  if (!ok) {
    End(absl::CancelledError(
        "CollectiveChunked: the stream broke while the result was sent"));
    return;
  }
  WriteNext();
}

void ChunkedCallReactor::WriteNext() {
  if (written_ == output_.size()) {
    End(absl::OkStatus());
    return;
  }
  const uint64_t n =
      std::min<uint64_t>(kMaxPieceBytes, output_.size() - written_);
  response_.set_data(output_.data() + written_, n);
  written_ += n;
  StartWrite(&response_);
}

void ChunkedCallReactor::End(const absl::Status& status) {
  if (phase_ == Phase::kFinished) return;
  phase_ = Phase::kFinished;
  std::string().swap(input_);
  std::string().swap(output_);
  Finish(ToGrpcStatus(status));
}

}  // namespace chorus
