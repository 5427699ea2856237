// Conversion between chorus::CollectiveSpec (chorus/types.h) and the
// chorus.v1.CollectiveSpec message that the coordinator's CollectiveRequest
// and the worker's LocalCollectiveRequest carry. Every place that puts a
// spec on the wire or takes one off it goes through these two functions.
//
// Pure functions; thread-safe.
#ifndef CHORUS_COMMON_COLLECTIVE_SPEC_PROTO_H_
#define CHORUS_COMMON_COLLECTIVE_SPEC_PROTO_H_

#include "chorus/types.h"
#include "chorus/v1/types.pb.h"

namespace chorus {

// Returns the spec `proto` carries, every field copied. An enum value the
// protocol does not know is kept as its number, so ValidateSpec can refuse
// it.
CollectiveSpec SpecFromProto(const v1::CollectiveSpec& proto);

// Returns `spec` as a chorus.v1.CollectiveSpec, every field copied; enum
// values outside the protocol's travel as their numbers.
v1::CollectiveSpec SpecToProto(const CollectiveSpec& spec);

}  // namespace chorus

#endif  // CHORUS_COMMON_COLLECTIVE_SPEC_PROTO_H_
