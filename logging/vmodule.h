// TPU_VMODULE matching: which VLOG level a source file gets.
//
// Thread-safety: pure functions.
//
//   std::vector<VmoduleEntry> vmodule = {{"premapped_*", 2}, {"*", 1}};
//   VmoduleLevel(vmodule, "allocator/premapped_region.cc");  // 2
//   VmoduleLevel(vmodule, "transfer/queue.cc");              // 1

#ifndef TPUSHIM_LOGGING_VMODULE_H_
#define TPUSHIM_LOGGING_VMODULE_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "env/options.h"

namespace tpushim::logging::internal {

// True when the glob `pattern` matches all of `text`: '*' matches any run
// of characters (also none), '?' exactly one character, any other
// character itself (glog's vmodule semantics; no escapes, no classes).
bool GlobMatch(absl::string_view pattern, absl::string_view text);

// The level of the first entry of `vmodule` whose glob matches the base name
// of `file` (a path or a base name) without its extension (up to the first
// '.'), or the base name with it; -1 when no entry matches.
int VmoduleLevel(const std::vector<VmoduleEntry>& vmodule,
                 absl::string_view file);

}  // namespace tpushim::logging::internal

#endif  // TPUSHIM_LOGGING_VMODULE_H_
