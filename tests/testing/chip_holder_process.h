// A chip_holder process (tests/driver/chip_holder_main.cc) for the tests of
// chips owned across processes: started with fork+exec, talked to over
// pipes, killed and reaped when the object goes, so no test leaves it
// running or its chips held. It inherits the test's TPUSHIM_RUN_DIR.
//
//   testutil::Holder holder(CHIP_HOLDER_PATH, "sim://?devices=2", "1");
//   ASSERT_EQ(holder.ReadLine(), absl::StrCat("ready ", holder.pid()));

#ifndef TPUSHIM_TESTS_TESTING_CHIP_HOLDER_PROCESS_H_
#define TPUSHIM_TESTS_TESTING_CHIP_HOLDER_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/fork_child.h"

namespace tpushim::testutil {

// A chip_holder process, talked to over pipes; killed and reaped when the
// object goes.
class Holder {
 public:
  // `uid` >= 0: the child runs as that user (and its group), which needs
  // root.
  Holder(const std::string& program, const std::string& device,
         const std::string& chips, int uid = -1) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      if (uid >= 0 && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(126);
      execl(program.c_str(), program.c_str(), device.c_str(), chips.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = fdopen(out[0], "r");
  }
  ~Holder() {
    if (to_ >= 0) close(to_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (from_ != nullptr) fclose(from_);
  }

  pid_t pid() const { return pid_; }
  // The next line it prints ("" at end of output). A hung holder is
  // killed by the ctest timeout; chip_holder never blocks before printing.
  std::string ReadLine() {
    char buf[4096];
    if (from_ == nullptr || fgets(buf, sizeof(buf), from_) == nullptr) {
      return "";
    }
    std::string line(buf);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    return line;
  }
  void Send(const std::string& line) {
    const std::string l = line + "\n";
    ASSERT_EQ(write(to_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
  }
  // SIGKILL, and reaped.
  void Kill() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Ends its input and waits for its exit code.
  int Finish() {
    close(to_);
    to_ = -1;
    const ForkResult r = WaitForChild(pid_);
    pid_ = -1;
    return r.Exited(0) ? 0 : 1;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
};

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_CHIP_HOLDER_PROCESS_H_
