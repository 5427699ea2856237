// RunInline: computes every rank's output of a collective whose inputs rode
// with the calls (the inline plan at the coordinator, the leader plan at a
// group's rank-0 worker), on the CPU reduce engine.
//
// Pure function; thread-safe.
#ifndef CHORUS_SERVER_REDUCE_CPU_INLINE_EXECUTOR_H_
#define CHORUS_SERVER_REDUCE_CPU_INLINE_EXECUTOR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/collective.h"

namespace chorus {

// `inputs[r]` is rank r's input, sized as InputBytes() says (off-root
// inputs of broadcast and scatter are ignored). Returns each rank's output,
// sized as OutputBytes() says; INVALID_ARGUMENT for a malformed spec or an
// input of the wrong size.
absl::StatusOr<std::vector<std::string>> RunInline(
    const CollectiveSpec& spec, int world_size,
    const std::vector<const std::string*>& inputs);

}  // namespace chorus

#endif  // CHORUS_SERVER_REDUCE_CPU_INLINE_EXECUTOR_H_
