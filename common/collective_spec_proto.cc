#include "common/collective_spec_proto.h"

namespace chorus {

CollectiveSpec SpecFromProto(const v1::CollectiveSpec& proto) {
  CollectiveSpec spec;
  spec.kind = static_cast<CollectiveKind>(proto.kind());
  spec.dtype = static_cast<DType>(proto.dtype());
  spec.count = proto.count();
  spec.op = static_cast<ReduceOp>(proto.op());
  spec.root = proto.root();
  return spec;
}

v1::CollectiveSpec SpecToProto(const CollectiveSpec& spec) {
  v1::CollectiveSpec proto;
  proto.set_kind(static_cast<v1::CollectiveKind>(spec.kind));
  proto.set_dtype(static_cast<v1::DType>(spec.dtype));
  proto.set_count(spec.count);
  proto.set_op(static_cast<v1::ReduceOp>(spec.op));
  proto.set_root(spec.root);
  return proto;
}

}  // namespace chorus
