#include "server/coordinator/status_page.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/collective.h"
#include "common/device.h"
#include "common/rank_list.h"

namespace chorus {
namespace {

std::string Html(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// "3.2s ago" style ages, to a tenth of a second.
std::string Age(absl::Duration age) {
  return absl::StrCat(
      absl::FormatDuration(absl::Trunc(std::max(age, absl::ZeroDuration()),
                                       absl::Milliseconds(100))),
      " ago");
}

// One table: an id, headings and rows of already escaped cells.
std::string Table(const char* id, const std::vector<const char*>& headings,
                  const std::vector<std::vector<std::string>>& rows,
                  const char* empty) {
  std::string out = absl::StrCat("<table id=\"", id, "\"><tr>");
  for (const char* heading : headings) {
    absl::StrAppend(&out, "<th>", heading, "</th>");
  }
  out += "</tr>\n";
  for (const std::vector<std::string>& row : rows) {
    out += "<tr>";
    for (const std::string& cell : row)
      absl::StrAppend(&out, "<td>", cell, "</td>");
    out += "</tr>\n";
  }
  if (rows.empty()) {
    absl::StrAppend(&out, "<tr><td colspan=\"", headings.size(),
                    "\" class=\"none\">", empty, "</td></tr>\n");
  }
  return out + "</table>\n";
}

// `name`, with its job when that is not the default one: "g (job blue)".
std::string WithJob(const std::string& name, const std::string& job) {
  return job.empty() ? name : absl::StrCat(name, " (job ", job, ")");
}

std::string WorkersTable(const Coordinator& core, absl::Time now) {
  std::vector<std::vector<std::string>> rows;
  for (const WorkerRecord& worker : core.Workers()) {
    std::vector<std::string> devices;
    for (const Device& device : worker.registration.devices) {
      devices.push_back(CanonicalName(device));
    }
    rows.push_back(
        {absl::StrCat(worker.id),
         Html(WithJob(worker.registration.name, worker.registration.job)),
         Html(worker.registration.address), Html(absl::StrJoin(devices, ", ")),
         Age(now - worker.renewed_at)});
  }
  return Table("workers",
               {"id", "name", "address", "devices", "last heartbeat"}, rows,
               "no worker is registered");
}

// What the group waits on now: its oldest pending collective and the ranks
// that have not called it.
std::string Waiting(const GroupSummary& group, absl::Time now) {
  if (group.pending_sequence == 0) return "";
  return Html(absl::StrCat("#", group.pending_sequence, " waits for ",
                           FormatRanks(group.missing_ranks), " since ",
                           Age(now - group.pending_since)));
}

std::string GroupsTable(const std::vector<GroupSummary>& groups,
                        absl::Time now) {
  std::vector<std::vector<std::string>> rows;
  for (const GroupSummary& group : groups) {
    // A large group's page would list every rank: the first ones say who.
    constexpr size_t kMembersShown = 64;
    std::vector<std::string> members;
    for (const GroupMember& member : group.view.members) {
      if (members.size() == kMembersShown) {
        members.push_back(
            absl::StrCat("and ", group.view.members.size() - kMembersShown,
                         " more (chorusctl groups lists them all)"));
        break;
      }
      members.push_back(absl::StrCat(member.rank, ": ", member.worker_name, " ",
                                     CanonicalName(member.device)));
    }
    std::string state =
        group.aborted.ok() ? std::string("active")
                           : absl::StrCat("aborted: ", group.aborted.message());
    if (group.view.min_world_size > 0) {
      absl::StrAppend(&state, "; elastic ", group.view.min_world_size, "..",
                      group.view.max_world_size, ", ", group.joiners_waiting,
                      " newcomers waiting");
    }
    rows.push_back(
        {Html(WithJob(group.view.name, group.job)),
         absl::StrCat(group.view.epoch), absl::StrCat(group.view.world_size),
         Html(absl::StrJoin(members, "; ")), absl::StrCat(group.completed),
         Html(state), Waiting(group, now)});
  }
  return Table("groups",
               {"group", "epoch", "world", "members (rank: worker device)",
                "collectives ended", "state", "waiting"},
               rows, "no group is formed");
}

std::string FormingTable(const std::vector<FormingSummary>& forming,
                         absl::Time now) {
  std::vector<std::vector<std::string>> rows;
  for (const FormingSummary& group : forming) {
    std::vector<std::string> joined;
    for (const GroupMember& member : group.joined) {
      joined.push_back(absl::StrCat(member.rank, ": ", member.worker_name));
    }
    rows.push_back({Html(WithJob(group.name, group.job)),
                    absl::StrCat(group.world_size),
                    Html(absl::StrJoin(joined, "; ")),
                    Html(absl::StrCat(FormatRanks(group.missing_ranks),
                                      " since ", Age(now - group.since)))});
  }
  return Table("forming",
               {"group", "world", "joined (rank: worker)", "waiting for"}, rows,
               "no join is waiting");
}

std::string VerdictsTable(const Coordinator& core,
                          const std::vector<GroupSummary>& groups, int limit,
                          absl::Time now) {
  std::vector<std::pair<std::string, TraceEntry>> ended;
  for (const GroupSummary& group : groups) {
    absl::StatusOr<std::vector<TraceEntry>> entries =
        core.Trace(group.job, group.view.name);
    if (!entries.ok()) continue;
    for (TraceEntry& entry : *entries) {
      if (entry.ended == absl::InfinitePast()) continue;
      ended.emplace_back(WithJob(group.view.name, group.job), std::move(entry));
    }
  }
  std::sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) {
    return a.second.ended > b.second.ended;
  });
  if (ended.size() > static_cast<size_t>(limit)) ended.resize(limit);
  std::vector<std::vector<std::string>> rows;
  for (const auto& [group, entry] : ended) {
    rows.push_back(
        {Age(now - entry.ended), Html(group), absl::StrCat(entry.epoch),
         absl::StrCat("#", entry.sequence),
         entry.state == TraceEntry::State::kMembershipChanged
             ? std::string("membership change")
             : Html(DescribeSpec(entry.spec)),
         std::string(AlgorithmName(entry.plan)),
         Html(entry.verdict.ok()
                  ? std::string("OK")
                  : entry.verdict.ToString(
                        absl::StatusToStringMode::kWithNoExtraData))});
  }
  return Table(
      "verdicts",
      {"ended", "group", "epoch", "call", "collective", "plan", "verdict"},
      rows, "no collective has ended yet");
}

}  // namespace

std::string RenderStatusPage(const Coordinator& core,
                             const StatusPageOptions& options) {
  const absl::Time now = core.clock()->Now();
  const std::vector<GroupSummary> groups = core.Groups();
  std::string page = absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
      "<meta http-equiv=\"refresh\" content=\"",
      options.refresh_seconds,
      "\"><title>Chorus coordinator</title><style>"
      "body{font-family:sans-serif;margin:1em}"
      "table{border-collapse:collapse;margin-bottom:1.5em}"
      "th,td{border:1px solid #bbb;padding:2px 8px;text-align:left}"
      "th{background:#eee}.none{color:#777}</style></head><body>\n"
      "<h1>Chorus coordinator</h1>\n<p id=\"summary\">",
      core.Workers().size(), " workers, ", groups.size(), " groups; lease ",
      absl::FormatDuration(core.lease_timeout()), "; as of ",
      absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", now, absl::UTCTimeZone()),
      "</p>\n");
  if (!options.leadership.empty()) {
    absl::StrAppend(&page, "<p id=\"leadership\">", Html(options.leadership),
                    "</p>\n");
  }
  page += "<h2>Workers</h2>\n";
  page += WorkersTable(core, now);
  page += "<h2>Groups</h2>\n";
  page += GroupsTable(groups, now);
  page += "<h2>Joins waiting</h2>\n";
  page += FormingTable(core.Forming(), now);
  page += "<h2>Recent verdicts</h2>\n";
  page += VerdictsTable(core, groups, options.recent_verdicts, now);
  page += "</body></html>\n";
  return page;
}

}  // namespace chorus
