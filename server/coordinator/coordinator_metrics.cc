#include "server/coordinator/coordinator_metrics.h"

#include <vector>

#include "common/metrics.h"

namespace chorus {

void ExportCoordinatorGauges(const Coordinator* core, const CallPort* call_port,
                             absl::Duration stall_after) {
  MetricsRegistry& metrics = DefaultMetrics();
  metrics.Gauge("chorus_workers", "Workers registered now.", {}, [core] {
    return GaugeSample{{{}, static_cast<double>(core->Workers().size())}};
  });
  metrics.Gauge(
      "chorus_groups",
      "Formed groups, by state: active, or aborted (until they form again).",
      {"state"}, [core] {
        double active = 0, aborted = 0;
        for (const GroupSummary& group : core->Groups()) {
          (group.aborted.ok() ? active : aborted) += 1;
        }
        return GaugeSample{{{"active"}, active}, {{"aborted"}, aborted}};
      });
  metrics.Gauge(
      "chorus_pending_collectives",
      "Collectives not ended yet, by phase: matching (waiting for some ranks' "
      "calls) or committing (on the data plane, waiting for commits).",
      {"phase"}, [core] {
        double matching = 0, committing = 0;
        for (const GroupSummary& group : core->Groups()) {
          matching += group.matching;
          committing += group.committing;
        }
        return GaugeSample{{{"matching"}, matching},
                           {{"committing"}, committing}};
      });
  metrics.Gauge(
      "chorus_stalled_groups",
      "Groups whose oldest collective has waited for some ranks longer than "
      "--stall_report_after.",
      {}, [core, stall_after] {
        const absl::Time now = core->clock()->Now();
        double stalled = 0;
        for (const GroupSummary& group : core->Groups()) {
          if (group.pending_sequence != 0 &&
              now - group.pending_since >= stall_after) {
            stalled += 1;
          }
        }
        return GaugeSample{{{}, stalled}};
      });
  if (call_port != nullptr) {
    metrics.Gauge("chorus_call_port_connections",
                  "Connections open to the coordinator's call port.", {},
                  [call_port] {
                    return GaugeSample{
                        {{}, static_cast<double>(call_port->connections())}};
                  });
  }
}

}  // namespace chorus
