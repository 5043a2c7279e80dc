// The real OS layer: direct system calls and libnuma.

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/mutex.h"
#include "common/page_hull.h"
#include "env/fork_guard.h"
#include "env/os.h"
#include "env/posix/io_uring_pins.h"

namespace tpushim {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  return absl::ErrnoToStatus(err, what);
}

std::string PtrArgs(const void* addr, size_t length) {
  return absl::StrFormat("%p, %d", addr, length);
}

FileInfo ToFileInfo(const struct stat& st) {
  FileInfo info;
  if (S_ISREG(st.st_mode)) {
    info.type = FileInfo::Type::kRegular;
  } else if (S_ISDIR(st.st_mode)) {
    info.type = FileInfo::Type::kDirectory;
  } else if (S_ISLNK(st.st_mode)) {
    info.type = FileInfo::Type::kSymlink;
  } else {
    info.type = FileInfo::Type::kOther;
  }
  info.owner = st.st_uid;
  info.mode = st.st_mode & 07777;
  info.size = static_cast<uint64_t>(st.st_size);
  info.modified = absl::TimeFromTimespec(st.st_mtim);
  return info;
}

// Runs `call(done, n, at)` — a pread or pwrite of `n` bytes at file offset
// `at`, `done` bytes into the buffer — until all `size` bytes moved,
// retrying short transfers and EINTR. OUT_OF_RANGE when the file ends.
template <typename Call>
absl::Status PositionedAll(absl::string_view name, size_t size, uint64_t offset,
                           Call call) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n =
        call(done, size - done, static_cast<off_t>(offset + done));
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const std::string what =
        absl::StrCat(name, "(", size, " bytes at ", offset, ")");
    if (n < 0) return ErrnoStatus(errno, what);
    return absl::OutOfRangeError(absl::StrCat(what, ": the file ends first"));
  }
  return absl::OkStatus();
}

class PosixOs final : public Os {
 public:
  PosixOs() : numa_available_(numa_available() >= 0) {}

  absl::StatusOr<void*> Mmap(void* addr, size_t length, int prot, int flags,
                             int fd, off_t offset) override {
    void* p = mmap(addr, length, prot, flags, fd, offset);
    if (p == MAP_FAILED) {
      return ErrnoStatus(errno, absl::StrCat("mmap(", length, " bytes)"));
    }
    return p;
  }

  absl::Status Munmap(void* addr, size_t length) override {
    if (munmap(addr, length) != 0) {
      return ErrnoStatus(errno,
                         absl::StrCat("munmap(", PtrArgs(addr, length), ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Madvise(void* addr, size_t length, int advice) override {
    while (madvise(addr, length, advice) != 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoStatus(errno, absl::StrCat("madvise(", PtrArgs(addr, length),
                                             ", ", advice, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Mlock(const void* addr, size_t length, LockWhen when) override {
    if (when == LockWhen::kOnFault) {
      if (mlock2(addr, length, MLOCK_ONFAULT) != 0) {
        return ErrnoStatus(errno, absl::StrCat("mlock2(", PtrArgs(addr, length),
                                               ", MLOCK_ONFAULT)"));
      }
      return absl::OkStatus();
    }
    if (mlock(addr, length) != 0) {
      return ErrnoStatus(errno,
                         absl::StrCat("mlock(", PtrArgs(addr, length), ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Munlock(const void* addr, size_t length) override {
    if (munlock(addr, length) != 0) {
      return ErrnoStatus(errno,
                         absl::StrCat("munlock(", PtrArgs(addr, length), ")"));
    }
    return absl::OkStatus();
  }

  // The kernel's long-term pin through io_uring (env/posix/io_uring_pins.h)
  // where it can be had; mlock() where io_uring is unavailable, out of
  // slots, or refuses the memory (file-backed mappings), and also when it
  // hits the memlock limit: io_uring charges the user's pins in all its
  // processes, mlock this process's locked memory, so mlock may still fit.
  absl::Status PinRange(const void* addr, size_t length) override {
    const PageHull hull = PageHull::Of(addr, length, PageSize());
    const Key key{hull.begin, hull.length()};
    if (IoUringPins* pins = Pins();
        pins != nullptr && hull.length() <= kMaxIoUringPin) {
      absl::StatusOr<uint32_t> slot = pins->Pin(hull.start(), hull.length());
      if (slot.ok()) {
        MutexLock lock(&pins_mu_);
        pinned_.emplace(key, static_cast<int64_t>(*slot));
        return absl::OkStatus();
      }
    }
    if (mlock(hull.start(), hull.length()) != 0) {
      return ErrnoStatus(
          errno, absl::StrCat("mlock(", PtrArgs(hull.start(), hull.length()),
                              ") to pin a transfer buffer"));
    }
    MutexLock lock(&pins_mu_);
    pinned_.emplace(key, kMlocked);
    return absl::OkStatus();
  }

  std::string TakePinNote() override {
    MutexLock lock(&pins_mu_);
    return std::exchange(pin_note_, std::string());
  }

  absl::Status UnpinRange(const void* addr, size_t length) override {
    const PageHull hull = PageHull::Of(addr, length, PageSize());
    int64_t how = kMlocked;
    {
      MutexLock lock(&pins_mu_);
      auto it = pinned_.find(Key{hull.begin, hull.length()});
      if (it != pinned_.end()) {
        how = it->second;
        pinned_.erase(it);
      }
    }
    if (how != kMlocked) {
      // A forked child shares the parent's ring: the slot is the parent's.
      if (ForkedChildOf(pins_pid_)) return absl::OkStatus();
      return pins_->Unpin(static_cast<uint32_t>(how));
    }
    if (munlock(hull.start(), hull.length()) != 0) {
      return ErrnoStatus(
          errno, absl::StrCat("munlock(", PtrArgs(hull.start(), hull.length()),
                              ") to unpin a transfer buffer"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ResourceLimit> GetMemlockLimit() override {
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
      return ErrnoStatus(errno, "getrlimit(RLIMIT_MEMLOCK)");
    }
    auto convert = [](rlim_t v) {
      return v == RLIM_INFINITY ? ResourceLimit::kUnlimited
                                : static_cast<uint64_t>(v);
    };
    return ResourceLimit{convert(rl.rlim_cur), convert(rl.rlim_max)};
  }

  bool HasIpcLockCapability() override {
    // CapEff in /proc/self/status is a hex mask; CAP_IPC_LOCK is bit 14.
    absl::StatusOr<std::string> status = ReadFile("/proc/self/status");
    if (!status.ok()) return false;
    for (absl::string_view line : absl::StrSplit(*status, '\n')) {
      if (!absl::ConsumePrefix(&line, "CapEff:")) continue;
      uint64_t mask = 0;
      if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &mask)) {
        return false;
      }
      constexpr int kCapIpcLock = 14;
      return (mask >> kCapIpcLock) & 1;
    }
    return false;
  }

  size_t PageSize() override {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
  }

  int NumaNodeCount() override {
    if (!numa_available_) return 1;
    MutexLock lock(&numa_mu_);
    return numa_num_configured_nodes() > 0 ? numa_num_configured_nodes() : 1;
  }

  int NumaNodeOfCurrentCpu() override {
    if (!numa_available_) return 0;
    const int cpu = sched_getcpu();
    if (cpu < 0) return 0;
    MutexLock lock(&numa_mu_);
    const int node = numa_node_of_cpu(cpu);
    return node < 0 ? 0 : node;
  }

  absl::Status NumaBindMemory(void* addr, size_t length, int node) override {
    if (!numa_available_) {
      if (node == 0) return absl::OkStatus();  // one node: nothing to bind
      return absl::InvalidArgumentError(absl::StrCat(
          "NUMA node ", node, " requested but this host has no NUMA support"));
    }
    MutexLock lock(&numa_mu_);
    if (node < 0 || node > numa_max_node()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NUMA node ", node, " does not exist (nodes 0..",
                       numa_max_node(), ")"));
    }
    std::unique_ptr<bitmask, void (*)(bitmask*)> mask(numa_allocate_nodemask(),
                                                      numa_bitmask_free);
    numa_bitmask_setbit(mask.get(), static_cast<unsigned>(node));
    if (mbind(addr, length, MPOL_BIND, mask->maskp, mask->size + 1, 0) != 0) {
      return ErrnoStatus(errno, absl::StrCat("mbind(", PtrArgs(addr, length),
                                             ", node ", node, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status NumaRunOnNode(int node) override {
    if (!numa_available_) {
      if (node == 0) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          "NUMA node ", node, " requested but this host has no NUMA support"));
    }
    MutexLock lock(&numa_mu_);
    if (numa_run_on_node(node) != 0) {
      return ErrnoStatus(errno, absl::StrCat("numa_run_on_node(", node, ")"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<NumaNodeMemory> NumaMemoryOfNode(int node) override {
    MutexLock lock(&numa_mu_);
    if (!numa_available_ || node < 0 || node > numa_max_node()) {
      if (!numa_available_ && node == 0) {
        // Without NUMA the whole machine is node 0.
        const long pages = sysconf(_SC_PHYS_PAGES);
        const long avail = sysconf(_SC_AVPHYS_PAGES);
        return NumaNodeMemory{static_cast<uint64_t>(pages) * PageSize(),
                              static_cast<uint64_t>(avail) * PageSize()};
      }
      return absl::InvalidArgumentError(
          absl::StrCat("NUMA node ", node, " does not exist"));
    }
    long long free_bytes = 0;
    const long long total = numa_node_size64(node, &free_bytes);
    if (total < 0) {
      return ErrnoStatus(errno, absl::StrCat("numa_node_size64(", node, ")"));
    }
    return NumaNodeMemory{static_cast<uint64_t>(total),
                          static_cast<uint64_t>(free_bytes)};
  }

  absl::StatusOr<MemoryPolicy> MemoryPolicyOf(const void* addr) override {
    // Room for every node the kernel may name.
    std::vector<unsigned long> mask(16);
    const unsigned long maxnode = mask.size() * 8 * sizeof(unsigned long);
    int mode = 0;
    if (get_mempolicy(&mode, mask.data(), maxnode, const_cast<void*>(addr),
                      MPOL_F_ADDR) != 0) {
      if (errno == ENOSYS) {
        return absl::UnimplementedError("this kernel has no NUMA support");
      }
      return ErrnoStatus(errno, absl::StrFormat("get_mempolicy(%p)", addr));
    }
    MemoryPolicy policy;
    policy.mode = mode;
    for (unsigned long n = 0; n < maxnode; ++n) {
      if (mask[n / (8 * sizeof(unsigned long))] >>
              (n % (8 * sizeof(unsigned long))) &
          1) {
        policy.nodes.push_back(static_cast<int>(n));
      }
    }
    return policy;
  }

  absl::StatusOr<std::vector<int>> NodesOfPages(
      const std::vector<const void*>& pages) override {
    std::vector<int> status(pages.size(), 0);
    if (pages.empty()) return status;
    if (move_pages(0, pages.size(), const_cast<void**>(pages.data()), nullptr,
                   status.data(), 0) != 0) {
      if (errno == ENOSYS) {
        return absl::UnimplementedError("this kernel has no NUMA support");
      }
      return ErrnoStatus(errno, absl::StrCat("move_pages(", pages.size(),
                                             " pages, query)"));
    }
    return status;
  }

  std::optional<std::string> GetEnv(const std::string& name) override {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  }

  std::vector<std::string> EnvironmentNames() override {
    std::vector<std::string> names;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const char* eq = std::strchr(*e, '=');
      names.emplace_back(*e, eq == nullptr ? std::strlen(*e) : eq - *e);
    }
    return names;
  }

  int64_t MonotonicNanos() override {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  }

  absl::Time Now() override { return absl::Now(); }

  pid_t ThreadId() override { return static_cast<pid_t>(syscall(SYS_gettid)); }

  pid_t ProcessId() override { return getpid(); }

  uid_t EffectiveUid() override { return geteuid(); }

  std::string UserName() override {
    const uid_t uid = geteuid();
    struct passwd pwd;
    struct passwd* result = nullptr;
    std::vector<char> buffer(16384);
    if (getpwuid_r(uid, &pwd, buffer.data(), buffer.size(), &result) == 0 &&
        result != nullptr && result->pw_name != nullptr &&
        result->pw_name[0] != '\0') {
      return result->pw_name;
    }
    return absl::StrCat("uid", uid);
  }

  std::string HostName() override {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
      return "localhost";
    }
    std::string host(name);
    return host.substr(0, host.find('.'));
  }

  int OnlineCpuCount() override {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? static_cast<int>(n) : 1;
  }

  bool ProcessExists(pid_t pid) override {
    return kill(pid, 0) == 0 || errno != ESRCH;
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open(", path, ")"));
    std::string contents;
    char buffer[4096];
    for (;;) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        close(fd);
        return ErrnoStatus(err, absl::StrCat("read(", path, ")"));
      }
      if (n == 0) break;
      contents.append(buffer, static_cast<size_t>(n));
    }
    close(fd);
    return contents;
  }

  absl::StatusOr<FileInfo> Lstat(const std::string& path) override {
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) {
      return ErrnoStatus(errno, absl::StrCat("lstat(", path, ")"));
    }
    return ToFileInfo(st);
  }

  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return ErrnoStatus(errno, absl::StrCat("stat(", path, ")"));
    }
    return ToFileInfo(st);
  }

  absl::Status Access(const std::string& path, int mode) override {
    if (faccessat(AT_FDCWD, path.c_str(), mode, AT_EACCESS) != 0) {
      return ErrnoStatus(errno, absl::StrCat("access(", path, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status MakeDirectory(const std::string& path, mode_t mode) override {
    if (mkdir(path.c_str(), mode) != 0) {
      return ErrnoStatus(errno, absl::StrCat("mkdir(", path, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status ChangeMode(const std::string& path, mode_t mode) override {
    if (chmod(path.c_str(), mode) != 0) {
      return ErrnoStatus(errno, absl::StrCat("chmod(", path, ")"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int> OpenLockFile(const std::string& path,
                                   bool create) override {
    if (!create) {
      const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open(", path, ")"));
      return fd;
    }
    // O_EXCL first, to know whether this call made the file (and may give
    // it to every user).
    int fd = open(path.c_str(),
                  O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) {
      (void)fchmod(fd, 0666);
      return fd;
    }
    if (errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat("open(", path, ")"));
    }
    fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open(", path, ")"));
    return fd;
  }

  absl::StatusOr<bool> TryLockFile(int fd) override {
    struct flock lock = {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    if (fcntl(fd, F_OFD_SETLK, &lock) == 0) return true;
    if (errno == EAGAIN || errno == EACCES) return false;
    return ErrnoStatus(errno, "fcntl(F_OFD_SETLK)");
  }

  absl::StatusOr<bool> FileLockedByOther(int fd) override {
    struct flock lock = {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    if (fcntl(fd, F_OFD_GETLK, &lock) != 0) {
      return ErrnoStatus(errno, "fcntl(F_OFD_GETLK)");
    }
    return lock.l_type != F_UNLCK;
  }

  absl::StatusOr<int> CreateOutputFile(const std::string& path) override {
    const int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
             0644);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open(", path, ")"));
    return fd;
  }

  absl::StatusOr<int> CreateLogFile(const std::string& path) override {
    const int fd = open(
        path.c_str(),
        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_APPEND, 0644);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open(", path, ")"));
    return fd;
  }

  absl::Status WriteAll(int fd, const void* data, size_t size) override {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = write(fd, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "write");
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Truncate(int fd, uint64_t length) override {
    if (ftruncate(fd, static_cast<off_t>(length)) != 0) {
      return ErrnoStatus(errno, absl::StrCat("ftruncate(", length, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Close(int fd) override {
    if (close(fd) != 0 && errno != EINTR) return ErrnoStatus(errno, "close");
    return absl::OkStatus();
  }

  absl::Status Symlink(const std::string& target,
                       const std::string& link) override {
    if (symlink(target.c_str(), link.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("symlink(", link, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename(", from, ", ", to, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Unlink(const std::string& path) override {
    if (unlink(path.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("unlink(", path, ")"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDirectory(
      const std::string& path) override {
    DIR* dir = opendir(path.c_str());
    if (dir == nullptr) {
      return ErrnoStatus(errno, absl::StrCat("opendir(", path, ")"));
    }
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* entry = readdir(dir)) {
      const absl::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    const int err = errno;
    closedir(dir);
    if (err != 0) return ErrnoStatus(err, absl::StrCat("readdir(", path, ")"));
    return names;
  }

  absl::StatusOr<std::string> ReadLink(const std::string& path) override {
    std::string target(256, '\0');
    while (true) {
      const ssize_t n = readlink(path.c_str(), target.data(), target.size());
      if (n < 0)
        return ErrnoStatus(errno, absl::StrCat("readlink(", path, ")"));
      if (static_cast<size_t>(n) < target.size()) {
        target.resize(static_cast<size_t>(n));
        return target;
      }
      target.resize(target.size() * 2);
    }
  }

  absl::StatusOr<int> OpenDevice(const std::string& path, int flags) override {
    const int fd = open(path.c_str(), flags | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open(", path, ")"));
    return fd;
  }

  absl::StatusOr<int> Ioctl(int fd, unsigned long request, void* arg,
                            const char* name) override {
    int r;
    do {
      r = ioctl(fd, request, arg);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return ErrnoStatus(errno, absl::StrCat("ioctl(", name, ")"));
    return r;
  }

  absl::Status PreadAll(int fd, void* data, size_t size,
                        uint64_t offset) override {
    return PositionedAll(
        "pread", size, offset, [&](size_t done, size_t n, off_t at) {
          return pread(fd, static_cast<char*>(data) + done, n, at);
        });
  }

  absl::Status PwriteAll(int fd, const void* data, size_t size,
                         uint64_t offset) override {
    return PositionedAll(
        "pwrite", size, offset, [&](size_t done, size_t n, off_t at) {
          return pwrite(fd, static_cast<const char*>(data) + done, n, at);
        });
  }

  absl::StatusOr<int> CreateEventFd() override {
    const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return ErrnoStatus(errno, "eventfd");
    return fd;
  }

  absl::Status SignalEventFd(int fd) override {
    const uint64_t one = 1;
    while (write(fd, &one, sizeof(one)) < 0) {
      if (errno != EINTR) return ErrnoStatus(errno, "write(eventfd)");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> DrainEventFd(int fd) override {
    uint64_t value = 0;
    while (read(fd, &value, sizeof(value)) < 0) {
      if (errno == EAGAIN) return 0;
      if (errno != EINTR) return ErrnoStatus(errno, "read(eventfd)");
    }
    return value;
  }

  absl::StatusOr<int> WaitReadable(const std::vector<int>& fds,
                                   int timeout_ms) override {
    std::vector<pollfd> polled(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
      polled[i] = pollfd{.fd = fds[i], .events = POLLIN, .revents = 0};
    }
    while (true) {
      const int n = poll(polled.data(), polled.size(), timeout_ms);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "poll");
      if (n == 0) return -1;
      for (size_t i = 0; i < polled.size(); ++i) {
        if (polled[i].revents != 0) return static_cast<int>(i);
      }
      return -1;
    }
  }

 private:
  // A pinned range: its page hull.
  using Key = std::pair<uintptr_t, size_t>;
  static constexpr int64_t kMlocked = -1;
  static constexpr size_t kMaxIoUringPin = size_t{1} << 30;

  // The io_uring pins, opened on first use; null when unavailable, and in
  // a forked child, which shares the ring and its slots with its parent
  // but not the record of which slots are free.
  IoUringPins* Pins() {
    std::call_once(pins_once_, [this] {
      std::string why;
      pins_ = IoUringPins::Open(this, &why);
      pins_pid_ = CurrentProcessId();
      if (pins_ == nullptr) {
        MutexLock lock(&pins_mu_);
        pin_note_ = absl::StrCat(
            "Transfer buffers are pinned with mlock(), not the kernel's "
            "long-term pin through io_uring, for the life of the process: ",
            why);
      }
    });
    return ForkedChildOf(pins_pid_) ? nullptr : pins_.get();
  }

  std::once_flag pins_once_;
  std::unique_ptr<IoUringPins> pins_;
  pid_t pins_pid_ = 0;  // set once, by the call_once above
  Mutex pins_mu_;
  // How each pinned range was pinned: its io_uring slot, or kMlocked. One
  // range may be pinned more than once (by two engines): one entry each.
  std::multimap<Key, int64_t> pinned_ ABSL_GUARDED_BY(pins_mu_);
  // Why io_uring cannot pin, until TakePinNote hands it out.
  std::string pin_note_ ABSL_GUARDED_BY(pins_mu_);

  const bool numa_available_;
  // libnuma caches node masks in globals it fills in without locking
  // (numa_node_to_cpus, reached from numa_run_on_node, races when two
  // pre-fault threads bind at once: found by ThreadSanitizer), so every
  // libnuma call here holds this.
  Mutex numa_mu_;
};

}  // namespace

Os* Os::Default() {
  static Os* const os = new PosixOs();
  return os;
}

}  // namespace tpushim
