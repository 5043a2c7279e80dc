#include "logging/build_facts.h"

#include "logging/build_facts_values.h"

namespace tpushim::logging {

BuildFacts ThisBuild() {
  namespace values = build_facts_internal;
  return BuildFacts{.built = absl::FromUnixSeconds(values::kUnixSeconds),
                    .user = values::kUser,
                    .host = values::kHost,
                    .path = values::kPath,
                    .target = values::kTarget};
}

}  // namespace tpushim::logging
