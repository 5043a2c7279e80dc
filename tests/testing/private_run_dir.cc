// Linked into every test program (tpushim_add_test): unless whoever runs it
// set TPUSHIM_RUN_DIR, the process gets a run directory of its own before
// main(), so that the chip locks of tests running side by side (ctest -j)
// never meet, and a System a test creates never waits on one another test
// holds. Child processes a test starts inherit it (they are meant to meet
// their parent). The directory and its lock files are removed when the
// process that made it exits normally.

#include <dirent.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>

namespace {

class PrivateRunDir {
 public:
  PrivateRunDir() {
    if (getenv("TPUSHIM_RUN_DIR") != nullptr) return;
    char path[] = "/tmp/tpushim-test-run.XXXXXX";
    if (mkdtemp(path) == nullptr) return;
    dir_ = path;
    owner_ = getpid();
    setenv("TPUSHIM_RUN_DIR", path, 1);
  }
  ~PrivateRunDir() {
    if (dir_.empty() || getpid() != owner_) return;  // a fork() child
    if (DIR* d = opendir(dir_.c_str())) {
      while (const dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") unlink((dir_ + "/" + name).c_str());
      }
      closedir(d);
    }
    rmdir(dir_.c_str());
  }

 private:
  std::string dir_;
  pid_t owner_ = 0;
};

PrivateRunDir g_private_run_dir;

}  // namespace
