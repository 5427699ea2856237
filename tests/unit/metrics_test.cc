// The metrics registry and its Prometheus text rendering.
#include "common/metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsRegistryTest, Render_CounterWithLabels_OneLinePerSeries) {
  MetricsRegistry registry;
  CounterFamily* calls =
      registry.Counters("chorus_calls_total", "Calls.", {"kind", "code"});
  calls->With({"all_reduce", "OK"})->Add(3);
  calls->With({"barrier", "ABORTED"})->Add();
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP chorus_calls_total Calls.\n"
                              "# TYPE chorus_calls_total counter\n"));
  EXPECT_THAT(text,
              HasSubstr("chorus_calls_total{kind=\"all_reduce\",code=\"OK\"} "
                        "3\n"));
  EXPECT_THAT(
      text,
      HasSubstr("chorus_calls_total{kind=\"barrier\",code=\"ABORTED\"} 1\n"));
}

TEST(MetricsRegistryTest, Counters_SameName_SameFamilyAndSeries) {
  MetricsRegistry registry;
  CounterFamily* first = registry.Counters("chorus_x_total", "X.", {"a"});
  CounterFamily* second = registry.Counters("chorus_x_total", "X.", {"a"});
  EXPECT_EQ(first, second);
  EXPECT_EQ(first->With({"v"}), second->With({"v"}));
}

TEST(MetricsRegistryTest, Render_LabelValueWithQuotes_Escaped) {
  MetricsRegistry registry;
  registry.Counters("chorus_peers_total", "Peers.", {"peer"})
      ->With({"a\"b\\c\nd"})
      ->Add();
  EXPECT_THAT(registry.Render(),
              HasSubstr("chorus_peers_total{peer=\"a\\\"b\\\\c\\nd\"} 1\n"));
}

TEST(MetricsRegistryTest, Render_ScaledCounter_RendersSeconds) {
  MetricsRegistry registry;
  registry.Counters("chorus_busy_seconds_total", "Busy.", {}, 1e-9)
      ->With({})
      ->Add(1500000000);
  EXPECT_THAT(registry.Render(), HasSubstr("chorus_busy_seconds_total 1.5\n"));
}

TEST(MetricsRegistryTest, Render_Histogram_CumulativeBucketsSumAndCount) {
  MetricsRegistry registry;
  Histogram* latency = registry
                           .Histograms("chorus_latency_seconds", "Latency.",
                                       {"kind"}, {0.001, 0.01})
                           ->With({"barrier"});
  latency->Observe(0.0005);
  latency->Observe(0.001);  // on a bound: in that bucket
  latency->Observe(0.005);
  latency->Observe(2);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE chorus_latency_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("chorus_latency_seconds_bucket{kind=\"barrier\","
                              "le=\"0.001\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("chorus_latency_seconds_bucket{kind=\"barrier\","
                              "le=\"0.01\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("chorus_latency_seconds_bucket{kind=\"barrier\","
                              "le=\"+Inf\"} 4\n"));
  EXPECT_THAT(
      text, HasSubstr("chorus_latency_seconds_sum{kind=\"barrier\"} 2.0065\n"));
  EXPECT_THAT(text,
              HasSubstr("chorus_latency_seconds_count{kind=\"barrier\"} 4\n"));
}

TEST(MetricsRegistryTest, Render_Gauge_SampledAtEachRender) {
  MetricsRegistry registry;
  int workers = 1;
  registry.Gauge("chorus_workers", "Workers.", {}, [&workers] {
    return GaugeSample{{{}, static_cast<double>(workers)}};
  });
  EXPECT_THAT(registry.Render(), HasSubstr("chorus_workers 1\n"));
  workers = 4;
  EXPECT_THAT(registry.Render(), HasSubstr("chorus_workers 4\n"));
  EXPECT_THAT(registry.Render(), HasSubstr("# TYPE chorus_workers gauge\n"));
}

TEST(MetricsRegistryTest, Render_LevelUpAndDown_CurrentValue) {
  MetricsRegistry registry;
  Level* open =
      registry.Levels("chorus_open", "Open.", {"direction"})->With({"in"});
  open->Add();
  open->Add();
  open->Sub();
  EXPECT_THAT(registry.Render(),
              HasSubstr("chorus_open{direction=\"in\"} 1\n"));
}

TEST(MetricsRegistryTest, Render_FamiliesOrderedByName_NoEmptyLabelBraces) {
  MetricsRegistry registry;
  registry.Counters("chorus_b_total", "B.", {})->With({})->Add();
  registry.Counters("chorus_a_total", "A.", {})->With({})->Add();
  const std::string text = registry.Render();
  EXPECT_LT(text.find("chorus_a_total"), text.find("chorus_b_total"));
  EXPECT_THAT(text, Not(HasSubstr("{}")));
}

TEST(SizeBucketTest, SizeBucket_Bounds_SmallestBoundAtOrAbove) {
  EXPECT_STREQ(SizeBucket(0), "1KiB");
  EXPECT_STREQ(SizeBucket(1024), "1KiB");
  EXPECT_STREQ(SizeBucket(1025), "64KiB");
  EXPECT_STREQ(SizeBucket(64 << 20), "256MiB");
  EXPECT_STREQ(SizeBucket(uint64_t{1} << 30), "larger");
}

}  // namespace
}  // namespace chorus
