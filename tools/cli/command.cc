#include "tools/cli/command.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tpushim::tools {

void WriteJson(const nlohmann::ordered_json& value, std::ostream& out) {
  out << value.dump(2, ' ', /*ensure_ascii=*/false,
                    nlohmann::ordered_json::error_handler_t::replace)
      << "\n";
}

void ReportError(const absl::Status& status, absl::string_view what, bool json,
                 int exit_code, CommandContext& context) {
  if (json) {
    WriteJson({{"error",
                {{"code", absl::StatusCodeToString(status.code())},
                 {"message", std::string(status.message())}}}},
              *context.out);
  } else {
    // As the status prints itself (CODE: message): scripts grep the code.
    *context.err << "tpushim: " << what << ": " << status.ToString() << "\n";
  }
  context.exit_code = exit_code;
}

void ReportStartupError(const absl::Status& status, bool json,
                        CommandContext& context) {
  const bool invalid = absl::IsInvalidArgument(status);
  ReportError(status,
              invalid ? "invalid configuration" : "cannot start the runtime",
              json, invalid ? kExitUsage : kExitFailure, context);
}

}  // namespace tpushim::tools
