// What `chorusctl watch` prints for an event: the line for people and the
// JSON object for programs.
#include "client/cli/event_report.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

Event Aborted() {
  Event event;
  event.time = absl::FromUnixMicros(int64_t{1700000000} * 1000000 + 250);
  event.kind = Event::Kind::kGroupAborted;
  event.worker_id = 2;
  event.worker_name = "w1";
  event.group = "g";
  event.epoch = 17;
  event.ranks = {1, 3};
  event.status = absl::AbortedError("group g (epoch 17) aborted");
  event.text = "group g (epoch 17) aborted";
  return event;
}

TEST(EventReportTest, FormatEvent_Abort_TimeKindFieldsAndText) {
  EXPECT_EQ(FormatEvent(Aborted(), absl::UTCTimeZone()),
            "2023-11-14T22:13:20.000250+00:00 GROUP_ABORTED group=g "
            "epoch=17 ranks=1,3 worker=w1 worker_id=2 code=ABORTED: group g "
            "(epoch 17) aborted");
}

TEST(EventReportTest, FormatEvent_Dropped_OnlyItsFields) {
  Event event;
  event.time = absl::FromUnixSeconds(1700000000);
  event.kind = Event::Kind::kEventsDropped;
  event.dropped = 5;
  event.text = "5 events dropped";
  EXPECT_EQ(FormatEvent(event, absl::UTCTimeZone()),
            "2023-11-14T22:13:20.000000+00:00 EVENTS_DROPPED dropped=5: 5 "
            "events dropped");
}

TEST(EventReportTest, EventJson_Abort_EveryFieldOnOneLine) {
  Event event = Aborted();
  event.text = "a \"quoted\"\nline";
  const std::string json = EventJson(event);
  EXPECT_EQ(json.find('\n'), std::string::npos);
  EXPECT_EQ(json,
            "{\"time_ns\": 1700000000000250000, \"time\": "
            "\"2023-11-14T22:13:20.000250000Z\", \"kind\": \"GROUP_ABORTED\", "
            "\"worker_id\": 2, \"worker_name\": \"w1\", \"group\": \"g\", "
            "\"epoch\": 17, \"sequence\": 0, \"ranks\": [1, 3], \"code\": "
            "\"ABORTED\", \"message\": \"group g (epoch 17) aborted\", "
            "\"reason\": \"\", \"dropped\": 0, \"text\": \"a "
            "\\\"quoted\\\"\\nline\"}");
}

TEST(EventReportTest, EventJson_NoStatus_CodeOk) {
  Event event;
  event.kind = Event::Kind::kWorkerRegistered;
  EXPECT_THAT(EventJson(event), HasSubstr("\"code\": \"OK\""));
  EXPECT_THAT(EventJson(event), HasSubstr("\"ranks\": []"));
}

}  // namespace
}  // namespace chorus
