#include "logging/vmodule.h"

#include "logging/glog_format.h"

namespace tpushim::logging::internal {

bool GlobMatch(absl::string_view pattern, absl::string_view text) {
  // Greedy match that backtracks only to the last '*': O(|pattern|*|text|).
  size_t p = 0;
  size_t t = 0;
  size_t star = absl::string_view::npos;  // position of the last '*' seen
  size_t star_text = 0;                   // text position that '*' resumes at
  while (t < text.size()) {
    // '*' first: a '*' in the text is matched by the pattern's '*' (which
    // can backtrack), not taken as a literal.
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_text = t;
    } else if (p < pattern.size() &&
               (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      t = ++star_text;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

int VmoduleLevel(const std::vector<VmoduleEntry>& vmodule,
                 absl::string_view file) {
  const absl::string_view base = BaseName(file);
  const absl::string_view stem = base.substr(0, base.find('.'));
  for (const VmoduleEntry& entry : vmodule) {
    if (GlobMatch(entry.glob, stem) || GlobMatch(entry.glob, base)) {
      return entry.level;
    }
  }
  return -1;
}

}  // namespace tpushim::logging::internal
