// chip_holder: a process that owns chips through a tpushim::System, for the
// ownership tests (chip_ownership_test.cc), which start it as a real
// process and talk to it over stdin/stdout.
//
//   chip_holder <device url> <visible chips: "0,1" or "all">
//
// Creates the System (region off, no log files) and prints "ready <pid>".
// Then reads commands from stdin: "release" destroys the System and prints
// "released"; end of input exits 0. A System that cannot be created prints
// "error <code>: <message>" and exits 3.

#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tpushim/system.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: chip_holder <device url> <chips|all>\n";
    return 2;
  }
  tpushim::OptionOverrides o;
  o.device = argv[1];
  o.premapped_buffer_size = 0;
  o.log_dir = "disabled";
  o.stderr_log_level = 3;
  if (std::string(argv[2]) != "all") {
    std::vector<int> chips;
    for (absl::string_view c : absl::StrSplit(argv[2], ',')) {
      int chip = 0;
      if (!absl::SimpleAtoi(c, &chip)) return 2;
      chips.push_back(chip);
    }
    o.visible_chips = chips;
  }
  absl::StatusOr<std::unique_ptr<tpushim::System>> system =
      tpushim::System::Create(o);
  if (!system.ok()) {
    std::cout << "error " << absl::StatusCodeToString(system.status().code())
              << ": " << system.status().message() << std::endl;
    return 3;
  }
  std::cout << "ready " << getpid() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "release") {
      system->reset();
      std::cout << "released" << std::endl;
    }
  }
  return 0;
}
