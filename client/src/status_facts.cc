#include "chorus/status_facts.h"

#include "common/status_detail.h"

namespace chorus {

std::optional<StatusFacts> StatusFactsOf(const absl::Status& status) {
  std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status);
  if (!detail.has_value()) return std::nullopt;
  StatusFacts facts;
  facts.reason = detail->reason();
  facts.group = detail->group();
  facts.epoch = detail->epoch();
  facts.sequence = detail->sequence();
  facts.missing_ranks.assign(detail->missing_ranks().begin(),
                             detail->missing_ranks().end());
  facts.lost_worker = detail->lost_worker();
  facts.lost_worker_id = detail->lost_worker_id();
  facts.lost_ranks.assign(detail->lost_ranks().begin(),
                          detail->lost_ranks().end());
  facts.ranks.insert(detail->ranks().begin(), detail->ranks().end());
  facts.device = detail->device();
  facts.number_used = detail->number_used();
  facts.next_epoch = detail->next_epoch();
  facts.next_world_size = detail->next_world_size();
  facts.next_ranks.assign(detail->next_ranks().begin(),
                          detail->next_ranks().end());
  facts.joiners_waiting = detail->joiners_waiting();
  return facts;
}

}  // namespace chorus
