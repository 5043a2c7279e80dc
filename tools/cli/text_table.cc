#include "tools/cli/text_table.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tpushim::tools {

TextTable::TextTable(std::vector<std::string> header) {
  if (!header.empty()) rows_.push_back(std::move(header));
}

void TextTable::AddRow(std::vector<std::string> cells) {
  rows_.push_back(std::move(cells));
}

void TextTable::Print(std::ostream& out, int indent) const {
  std::vector<size_t> widths;
  for (const std::vector<std::string>& row : rows_) {
    if (row.size() > widths.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  const std::string margin(static_cast<size_t>(std::max(indent, 0)), ' ');
  for (const std::vector<std::string>& row : rows_) {
    std::string line = margin;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    // Trailing empty cells leave padding behind.
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << "\n";
  }
}

std::string SizeName(uint64_t bytes) {
  constexpr const char* kUnits[] = {"", "K", "M", "G", "T"};
  int unit = 0;
  while (unit < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrCat(bytes, kUnits[unit]);
}

}  // namespace tpushim::tools
