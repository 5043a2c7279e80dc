// Plain-text tables with aligned columns, for the human output of the
// `tpushim` subcommands.
//
//   TextTable table({"VARIABLE", "VALUE", "SOURCE"});
//   table.AddRow({"TPU_LOG_DIR", "/tmp/tpu_logs", "default"});
//   table.Print(std::cout);
//
// prints
//
//     VARIABLE     VALUE          SOURCE
//     TPU_LOG_DIR  /tmp/tpu_logs  default
//
// Each column is as wide as its widest cell (in bytes), columns are two
// spaces apart, lines carry no trailing spaces. Thread-compatible.

#ifndef TPUSHIM_TOOLS_CLI_TEXT_TABLE_H_
#define TPUSHIM_TOOLS_CLI_TEXT_TABLE_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace tpushim::tools {

class TextTable {
 public:
  // `header` is the first row; empty for a table without one.
  explicit TextTable(std::vector<std::string> header = {});

  // Appends a row. Rows may have fewer cells than others; the missing ones
  // are empty.
  void AddRow(std::vector<std::string> cells);

  // Writes every row, each line starting with `indent` spaces.
  void Print(std::ostream& out, int indent = 2) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// `bytes` exactly, in the largest binary unit that divides it: "4K",
// "256M", "1G", "1536K", or plain bytes ("1000") when not a whole number of
// KiB. The inverse of ParseByteSize for table cells and progress lines.
std::string SizeName(uint64_t bytes);

}  // namespace tpushim::tools

#endif  // TPUSHIM_TOOLS_CLI_TEXT_TABLE_H_
