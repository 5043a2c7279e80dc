// ClosestMatches: the known words a mistyped one most likely meant, for
// "did you mean" hints (command-line flags and subcommands, environment
// variables).
//
// Distance is the optimal string alignment distance (Levenshtein with
// adjacent transpositions: "stpe" is 1 from "step"), compared without
// regard to ASCII case.
//
// Thread-safety: pure functions.
//
//   ClosestMatches("--devics", {"--devices", "--steps"})  // {"--devices"}
//   ClosestMatches("--stepms", {"--steps", "--step-ms"})  // both: 1 edit
//   ClosestMatches("frobnicate", {"bench", "demo"})       // {}

#ifndef TPUSHIM_COMMON_CLOSEST_MATCH_H_
#define TPUSHIM_COMMON_CLOSEST_MATCH_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tpushim {

// Edits (insert, delete, substitute, swap two adjacent letters) between
// `a` and `b`, ignoring ASCII case.
size_t EditDistance(absl::string_view a, absl::string_view b);

// The candidates closest to `word`, if they are close enough to be a typo:
// at most `max_distance` edits, or by default a third of the word's length
// (at least 1, at most 3); several when they are equally close, in the
// candidates' order; none when nothing is close. An exact match (ignoring
// case) is returned too.
std::vector<std::string> ClosestMatches(
    absl::string_view word, const std::vector<std::string>& candidates,
    std::optional<size_t> max_distance = std::nullopt);

}  // namespace tpushim

#endif  // TPUSHIM_COMMON_CLOSEST_MATCH_H_
