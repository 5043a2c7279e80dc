#include "common/closest_match.h"

#include <algorithm>

#include "absl/strings/ascii.h"

namespace tpushim {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  // Three rows of the dynamic-programming table: two back for swaps.
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1),
      row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const char x = absl::ascii_tolower(a[i - 1]);
      const char y = absl::ascii_tolower(b[j - 1]);
      row[j] = std::min({prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (x != y)});
      if (i > 1 && j > 1 && x == absl::ascii_tolower(b[j - 2]) &&
          absl::ascii_tolower(a[i - 2]) == y) {
        row[j] = std::min(row[j], before[j - 2] + 1);
      }
    }
    before.swap(prev);
    prev.swap(row);
  }
  return prev[b.size()];
}

std::vector<std::string> ClosestMatches(
    absl::string_view word, const std::vector<std::string>& candidates,
    std::optional<size_t> max_distance) {
  const size_t limit =
      max_distance.value_or(std::clamp<size_t>(word.size() / 3, 1, 3));
  std::vector<std::string> best;
  size_t best_distance = limit + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best.clear();
      best_distance = d;
    }
    if (d == best_distance) best.push_back(c);
  }
  return best;
}

}  // namespace tpushim
