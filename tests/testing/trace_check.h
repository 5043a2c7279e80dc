// Test helper: reads a Chrome trace-event JSON document the way trace
// viewers do and reports what they would not show.
//
//  * Chrome DevTools binds a flow event (phase s, t or f) to the first slice
//    with the same pid, tid, timestamp and category; a flow whose ends do
//    not both bind to a slice is not drawn.
//  * Perfetto binds a flow start to the slice that encloses its timestamp
//    on its pid and tid, and a flow end with "bp":"e" likewise.
//  * Both draw the slices of one track as a stack, so two slices of a
//    track must either nest or not overlap at all.
//
//   const TraceViewCheck c = CheckTraceView(root);
//   EXPECT_EQ(c.flows_drawn_devtools, c.flows);
//   EXPECT_THAT(c.problems, IsEmpty());
//
// Thread-safety: pure function.

#ifndef TPUSHIM_TESTS_TESTING_TRACE_CHECK_H_
#define TPUSHIM_TESTS_TESTING_TRACE_CHECK_H_

#include <cstddef>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tpushim::testutil {

struct TraceViewCheck {
  size_t slices = 0;               // complete ("X") events
  size_t flows = 0;                // distinct flow ids with a start
  size_t flows_drawn_devtools = 0;
  size_t flows_drawn_perfetto = 0;
  // One line per flow not drawn and per pair of slices that overlap
  // without nesting (at most 20 lines, then a count).
  std::vector<std::string> problems;
};

TraceViewCheck CheckTraceView(const nlohmann::json& root);

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_TRACE_CHECK_H_
