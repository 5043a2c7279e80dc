// Early-return helpers for absl::Status and absl::StatusOr.
//
// abseil 20220623 ships neither RETURN_IF_ERROR nor ASSIGN_OR_RETURN; these
// are tpushim's, the only ones in the tree.
//
//   absl::Status Start() {
//     TPUSHIM_RETURN_IF_ERROR(os->Munmap(addr, len));
//     TPUSHIM_ASSIGN_OR_RETURN(void* p, os->Mmap(...));
//     TPUSHIM_ASSIGN_OR_RETURN(auto facts, ReadHostFacts(*os));
//     ...
//   }
//
// Both evaluate their argument exactly once. Thread-safe as the expressions
// they wrap.

#ifndef TPUSHIM_COMMON_STATUS_MACROS_H_
#define TPUSHIM_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tpushim::internal {

inline const absl::Status& AsStatus(const absl::Status& status) {
  return status;
}
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace tpushim::internal

#define TPUSHIM_STATUS_CONCAT_INNER_(a, b) a##b
#define TPUSHIM_STATUS_CONCAT_(a, b) TPUSHIM_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr<T>); if it is not OK,
// returns its status from the enclosing function.
#define TPUSHIM_RETURN_IF_ERROR(expr)                                \
  do {                                                               \
    const auto& tpushim_status_ = (expr);                            \
    if (ABSL_PREDICT_FALSE(                                          \
            !::tpushim::internal::AsStatus(tpushim_status_).ok())) { \
      return ::tpushim::internal::AsStatus(tpushim_status_);         \
    }                                                                \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); if it is not OK returns its
// status from the enclosing function, otherwise moves its value into `lhs`,
// which may be a declaration (`auto x`, `int y`) or an existing lvalue.
#define TPUSHIM_ASSIGN_OR_RETURN(lhs, rexpr) \
  TPUSHIM_ASSIGN_OR_RETURN_IMPL_(            \
      TPUSHIM_STATUS_CONCAT_(tpushim_statusor_, __LINE__), lhs, rexpr)

#define TPUSHIM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {                  \
    return std::move(statusor).status();                     \
  }                                                          \
  lhs = *std::move(statusor)

#endif  // TPUSHIM_COMMON_STATUS_MACROS_H_
