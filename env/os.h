// The OS layer: every operating-system call the runtime makes.
//
// Nothing in tpushim calls mmap, mlock, libnuma, getenv, clocks or the file
// system directly; it goes through an `Os`. `Os::Default()` is the real
// POSIX implementation (env/posix/). `OsWrapper` forwards every call to
// another `Os`, so a test overrides one method and keeps the rest real
// (leveldb's Env/EnvWrapper). `FaultInjectingOs` (env/fault_injection.h)
// fails chosen calls exactly as the kernel would and tracks what is mapped,
// locked, pinned and open.
//
// Errors: every fallible call returns the status of the real failure,
// `absl::ErrnoToStatus(errno, "<call>(<args>)")`, so an ENOMEM from mmap is
// RESOURCE_EXHAUSTED and an EACCES from open is PERMISSION_DENIED.
//
// Thread-safety: implementations are thread-safe; `Os::Default()` lives for
// the whole process and is never destroyed.
//
//   Os* os = Os::Default();
//   TPUSHIM_ASSIGN_OR_RETURN(void* p, os->Mmap(nullptr, len, PROT_READ |
//       PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
//   absl::Cleanup unmap = [&] { (void)os->Munmap(p, len); };

#ifndef TPUSHIM_ENV_OS_H_
#define TPUSHIM_ENV_OS_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tpushim {

// What lstat()/stat() tell about a path; the fields the runtime decides on.
struct FileInfo {
  enum class Type { kRegular, kDirectory, kSymlink, kOther };
  Type type = Type::kOther;
  uid_t owner = 0;
  mode_t mode = 0;  // permission bits and sticky bit (st_mode & 07777)
  uint64_t size = 0;
  absl::Time modified = absl::UnixEpoch();  // st_mtim
};

// A getrlimit() pair. `kUnlimited` stands for RLIM_INFINITY.
struct ResourceLimit {
  static constexpr uint64_t kUnlimited = ~uint64_t{0};
  uint64_t soft = 0;
  uint64_t hard = 0;
};

class Os {
 public:
  Os() = default;
  Os(const Os&) = delete;
  Os& operator=(const Os&) = delete;
  virtual ~Os() = default;

  // The real POSIX implementation. Never null, never destroyed.
  static Os* Default();

  // ---- Memory ------------------------------------------------------------

  // mmap(2). On success returns the mapping's address (never MAP_FAILED).
  virtual absl::StatusOr<void*> Mmap(void* addr, size_t length, int prot,
                                     int flags, int fd, off_t offset) = 0;
  // munmap(2).
  virtual absl::Status Munmap(void* addr, size_t length) = 0;
  // madvise(2), including MADV_POPULATE_WRITE and MADV_HUGEPAGE. EINVAL for
  // an advice the kernel does not know comes back as INVALID_ARGUMENT, which
  // callers use to detect old kernels.
  virtual absl::Status Madvise(void* addr, size_t length, int advice) = 0;
  // When mlock'ed pages are locked: kNow faults them all in first
  // (mlock(2)); kOnFault marks the range so each page is locked as it is
  // first touched (mlock2(MLOCK_ONFAULT), Linux 4.4), which lets several
  // threads pre-fault a locked range instead of one mlock() pass.
  enum class LockWhen { kNow, kOnFault };
  // mlock(2)/mlock2(2) and munlock(2) of the premapped region (fault point
  // `mlock`). The memlock limit is charged for the whole range at once.
  virtual absl::Status Mlock(const void* addr, size_t length,
                             LockWhen when) = 0;
  virtual absl::Status Munlock(const void* addr, size_t length) = 0;
  // Pins, then unpins, a caller's range for the length of one transfer
  // (fault point `pin`), charged to RLIMIT_MEMLOCK. The POSIX
  // implementation pins the page-aligned hull of the range long-term
  // through io_uring's registered buffers (env/posix/io_uring_pins.h),
  // else with mlock/munlock. REQUIRES: UnpinRange gets exactly the
  // (addr, length) of one PinRange.
  virtual absl::Status PinRange(const void* addr, size_t length) = 0;
  virtual absl::Status UnpinRange(const void* addr, size_t length) = 0;
  // Why PinRange pins with mlock rather than long-term, said once: the
  // first call after a PinRange found the long-term pin unavailable
  // returns the reason (for the caller to log), every other call "".
  virtual std::string TakePinNote() { return ""; }
  // getrlimit(RLIMIT_MEMLOCK).
  virtual absl::StatusOr<ResourceLimit> GetMemlockLimit() = 0;
  // True when the effective capability set holds CAP_IPC_LOCK.
  virtual bool HasIpcLockCapability() = 0;
  // sysconf(_SC_PAGESIZE).
  virtual size_t PageSize() = 0;

  // ---- NUMA (libnuma) ----------------------------------------------------

  // Number of configured NUMA nodes; 1 when libnuma says NUMA is unavailable.
  virtual int NumaNodeCount() = 0;
  // The node of the CPU the calling thread runs on (0 without NUMA).
  virtual int NumaNodeOfCurrentCpu() = 0;
  // Sets the memory policy of [addr, addr+length) to bind to `node`
  // (mbind MPOL_BIND). Must precede the first touch of the pages.
  virtual absl::Status NumaBindMemory(void* addr, size_t length, int node) = 0;
  // Restricts the calling thread to the CPUs of `node`.
  virtual absl::Status NumaRunOnNode(int node) = 0;
  // Size and free bytes of `node`.
  struct NumaNodeMemory {
    uint64_t total_bytes = 0;
    uint64_t free_bytes = 0;
  };
  virtual absl::StatusOr<NumaNodeMemory> NumaMemoryOfNode(int node) = 0;
  // The memory policy in force at `addr` (get_mempolicy with
  // MPOL_F_ADDR): its mode (MPOL_DEFAULT, MPOL_BIND, ... of <numaif.h>)
  // and nodes. UNIMPLEMENTED on a kernel without NUMA.
  struct MemoryPolicy {
    int mode = 0;
    std::vector<int> nodes;
  };
  virtual absl::StatusOr<MemoryPolicy> MemoryPolicyOf(const void* addr) = 0;
  // The node each of `pages` is on now (move_pages(2) without moving), or
  // a negative errno for a page that is not present. UNIMPLEMENTED on a
  // kernel without NUMA.
  virtual absl::StatusOr<std::vector<int>> NodesOfPages(
      const std::vector<const void*>& pages) = 0;

  // ---- Process, environment and clocks -----------------------------------

  // getenv(3); nullopt when the variable is unset (set-but-empty is "").
  virtual std::optional<std::string> GetEnv(const std::string& name) = 0;
  // The names of every variable set in the environment (environ(7)).
  virtual std::vector<std::string> EnvironmentNames() = 0;
  // CLOCK_MONOTONIC in nanoseconds.
  virtual int64_t MonotonicNanos() = 0;
  // Wall-clock time.
  virtual absl::Time Now() = 0;
  // gettid(2).
  virtual pid_t ThreadId() = 0;
  virtual pid_t ProcessId() = 0;
  virtual uid_t EffectiveUid() = 0;
  // Login name of the effective user (getpwuid_r), else "uid<N>"; never "".
  virtual std::string UserName() = 0;
  // gethostname(2) up to the first '.', else "localhost".
  virtual std::string HostName() = 0;
  // sysconf(_SC_NPROCESSORS_ONLN), at least 1.
  virtual int OnlineCpuCount() = 0;
  // kill(pid, 0) does not say ESRCH.
  virtual bool ProcessExists(pid_t pid) = 0;

  // ---- Files -------------------------------------------------------------

  // Whole contents of a small file, typically under /proc or /sys.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  virtual absl::StatusOr<FileInfo> Lstat(const std::string& path) = 0;
  virtual absl::StatusOr<FileInfo> Stat(const std::string& path) = 0;
  // access(2) with the effective ids (faccessat AT_EACCESS).
  virtual absl::Status Access(const std::string& path, int mode) = 0;
  // mkdir(2); ALREADY_EXISTS when the path exists.
  virtual absl::Status MakeDirectory(const std::string& path, mode_t mode) = 0;
  // Creates a new log file: open(O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|
  // O_CLOEXEC|O_APPEND, 0644). Never follows a symlink and never opens an
  // existing file (ALREADY_EXISTS). Fault point `log_open`. The caller owns
  // the returned descriptor and must Close() it.
  virtual absl::StatusOr<int> CreateLogFile(const std::string& path) = 0;
  // Creates or truncates a regular output file (a trace):
  // open(O_WRONLY|O_CREAT|O_TRUNC|O_NOFOLLOW|O_CLOEXEC, 0644). The caller
  // owns the descriptor and must Close() it.
  virtual absl::StatusOr<int> CreateOutputFile(const std::string& path) = 0;
  // Writes all `size` bytes (retrying short writes and EINTR). On error,
  // the bytes before the failing write() stay written.
  virtual absl::Status WriteAll(int fd, const void* data, size_t size) = 0;
  // ftruncate(2): cuts the open file `fd` to `length` bytes.
  virtual absl::Status Truncate(int fd, uint64_t length) = 0;
  virtual absl::Status Close(int fd) = 0;
  // symlink(2): creates `link` pointing at `target` (which may be relative).
  virtual absl::Status Symlink(const std::string& target,
                               const std::string& link) = 0;
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  virtual absl::Status Unlink(const std::string& path) = 0;
  // Names in `path` other than "." and "..", in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> ListDirectory(
      const std::string& path) = 0;
  // readlink(2): the target of the symbolic link `path`.
  virtual absl::StatusOr<std::string> ReadLink(const std::string& path) = 0;

  // chmod(2).
  virtual absl::Status ChangeMode(const std::string& path, mode_t mode) = 0;

  // ---- Chip lock files ---------------------------------------------------

  // Opens a chip's lock file: with `create`, open(O_RDWR|O_CREAT|
  // O_NOFOLLOW|O_CLOEXEC) and, when this call created it, mode 0666
  // whatever the umask (processes of every user lock it); without,
  // open(O_RDONLY|O_NOFOLLOW|O_CLOEXEC) (NOT_FOUND when it does not
  // exist). No fault point covers it. The caller owns the descriptor and
  // must Close() it.
  virtual absl::StatusOr<int> OpenLockFile(const std::string& path,
                                           bool create) = 0;
  // Takes an exclusive open file description lock on the whole file
  // (fcntl F_OFD_SETLK, F_WRLCK) without waiting: true when taken, false
  // when another open file description holds one. The kernel drops it
  // when the last descriptor of the description is closed, so also when
  // its process exits or is killed.
  virtual absl::StatusOr<bool> TryLockFile(int fd) = 0;
  // Whether another open file description holds a lock on the file
  // (F_OFD_GETLK); takes nothing.
  virtual absl::StatusOr<bool> FileLockedByOther(int fd) = 0;

  // ---- Devices (VFIO) ----------------------------------------------------

  // open(2) of a device node such as /dev/vfio/12, with O_CLOEXEC added.
  // The caller owns the descriptor and must Close() it.
  virtual absl::StatusOr<int> OpenDevice(const std::string& path,
                                         int flags) = 0;
  // ioctl(2). Returns its non-negative result (a new descriptor for
  // VFIO_GROUP_GET_DEVICE_FD, which the caller must Close()). `name` names
  // the request in the error, e.g. "VFIO_IOMMU_MAP_DMA" (fault point
  // `vfio` in FaultInjectingOs).
  virtual absl::StatusOr<int> Ioctl(int fd, unsigned long request, void* arg,
                                    const char* name) = 0;
  // pread(2)/pwrite(2) of exactly `size` bytes at `offset` (retrying short
  // transfers and EINTR); OUT_OF_RANGE when the file ends first.
  virtual absl::Status PreadAll(int fd, void* data, size_t size,
                                uint64_t offset) = 0;
  virtual absl::Status PwriteAll(int fd, const void* data, size_t size,
                                 uint64_t offset) = 0;
  // eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK). The caller must Close() it.
  virtual absl::StatusOr<int> CreateEventFd() = 0;
  // Adds 1 to an eventfd's counter (wakes its readers).
  virtual absl::Status SignalEventFd(int fd) = 0;
  // Reads and clears an eventfd's counter: 0 when it was 0.
  virtual absl::StatusOr<uint64_t> DrainEventFd(int fd) = 0;
  // poll(2) for readability of `fds` for up to `timeout_ms` (-1: forever).
  // Returns the index in `fds` of one that is readable, or -1 on timeout.
  virtual absl::StatusOr<int> WaitReadable(const std::vector<int>& fds,
                                           int timeout_ms) = 0;
};

// Forwards every call to `target`, which must outlive the wrapper. Subclass
// it and override the calls a test wants to change.
class OsWrapper : public Os {
 public:
  explicit OsWrapper(Os* target) : target_(target) {}

  Os* target() const { return target_; }

  absl::StatusOr<void*> Mmap(void* addr, size_t length, int prot, int flags,
                             int fd, off_t offset) override {
    return target_->Mmap(addr, length, prot, flags, fd, offset);
  }
  absl::Status Munmap(void* addr, size_t length) override {
    return target_->Munmap(addr, length);
  }
  absl::Status Madvise(void* addr, size_t length, int advice) override {
    return target_->Madvise(addr, length, advice);
  }
  absl::Status Mlock(const void* addr, size_t length, LockWhen when) override {
    return target_->Mlock(addr, length, when);
  }
  absl::Status Munlock(const void* addr, size_t length) override {
    return target_->Munlock(addr, length);
  }
  absl::Status PinRange(const void* addr, size_t length) override {
    return target_->PinRange(addr, length);
  }
  absl::Status UnpinRange(const void* addr, size_t length) override {
    return target_->UnpinRange(addr, length);
  }
  std::string TakePinNote() override { return target_->TakePinNote(); }
  absl::StatusOr<ResourceLimit> GetMemlockLimit() override {
    return target_->GetMemlockLimit();
  }
  bool HasIpcLockCapability() override {
    return target_->HasIpcLockCapability();
  }
  size_t PageSize() override { return target_->PageSize(); }
  int NumaNodeCount() override { return target_->NumaNodeCount(); }
  int NumaNodeOfCurrentCpu() override {
    return target_->NumaNodeOfCurrentCpu();
  }
  absl::Status NumaBindMemory(void* addr, size_t length, int node) override {
    return target_->NumaBindMemory(addr, length, node);
  }
  absl::Status NumaRunOnNode(int node) override {
    return target_->NumaRunOnNode(node);
  }
  absl::StatusOr<NumaNodeMemory> NumaMemoryOfNode(int node) override {
    return target_->NumaMemoryOfNode(node);
  }
  absl::StatusOr<MemoryPolicy> MemoryPolicyOf(const void* addr) override {
    return target_->MemoryPolicyOf(addr);
  }
  absl::StatusOr<std::vector<int>> NodesOfPages(
      const std::vector<const void*>& pages) override {
    return target_->NodesOfPages(pages);
  }
  std::optional<std::string> GetEnv(const std::string& name) override {
    return target_->GetEnv(name);
  }
  std::vector<std::string> EnvironmentNames() override {
    return target_->EnvironmentNames();
  }
  int64_t MonotonicNanos() override { return target_->MonotonicNanos(); }
  absl::Time Now() override { return target_->Now(); }
  pid_t ThreadId() override { return target_->ThreadId(); }
  pid_t ProcessId() override { return target_->ProcessId(); }
  uid_t EffectiveUid() override { return target_->EffectiveUid(); }
  std::string UserName() override { return target_->UserName(); }
  std::string HostName() override { return target_->HostName(); }
  int OnlineCpuCount() override { return target_->OnlineCpuCount(); }
  bool ProcessExists(pid_t pid) override { return target_->ProcessExists(pid); }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return target_->ReadFile(path);
  }
  absl::StatusOr<FileInfo> Lstat(const std::string& path) override {
    return target_->Lstat(path);
  }
  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    return target_->Stat(path);
  }
  absl::Status Access(const std::string& path, int mode) override {
    return target_->Access(path, mode);
  }
  absl::Status MakeDirectory(const std::string& path, mode_t mode) override {
    return target_->MakeDirectory(path, mode);
  }
  absl::StatusOr<int> CreateLogFile(const std::string& path) override {
    return target_->CreateLogFile(path);
  }
  absl::StatusOr<int> CreateOutputFile(const std::string& path) override {
    return target_->CreateOutputFile(path);
  }
  absl::Status WriteAll(int fd, const void* data, size_t size) override {
    return target_->WriteAll(fd, data, size);
  }
  absl::Status Truncate(int fd, uint64_t length) override {
    return target_->Truncate(fd, length);
  }
  absl::Status Close(int fd) override { return target_->Close(fd); }
  absl::Status Symlink(const std::string& target,
                       const std::string& link) override {
    return target_->Symlink(target, link);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return target_->Rename(from, to);
  }
  absl::Status Unlink(const std::string& path) override {
    return target_->Unlink(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDirectory(
      const std::string& path) override {
    return target_->ListDirectory(path);
  }
  absl::StatusOr<std::string> ReadLink(const std::string& path) override {
    return target_->ReadLink(path);
  }
  absl::Status ChangeMode(const std::string& path, mode_t mode) override {
    return target_->ChangeMode(path, mode);
  }
  absl::StatusOr<int> OpenLockFile(const std::string& path,
                                   bool create) override {
    return target_->OpenLockFile(path, create);
  }
  absl::StatusOr<bool> TryLockFile(int fd) override {
    return target_->TryLockFile(fd);
  }
  absl::StatusOr<bool> FileLockedByOther(int fd) override {
    return target_->FileLockedByOther(fd);
  }
  absl::StatusOr<int> OpenDevice(const std::string& path, int flags) override {
    return target_->OpenDevice(path, flags);
  }
  absl::StatusOr<int> Ioctl(int fd, unsigned long request, void* arg,
                            const char* name) override {
    return target_->Ioctl(fd, request, arg, name);
  }
  absl::Status PreadAll(int fd, void* data, size_t size,
                        uint64_t offset) override {
    return target_->PreadAll(fd, data, size, offset);
  }
  absl::Status PwriteAll(int fd, const void* data, size_t size,
                         uint64_t offset) override {
    return target_->PwriteAll(fd, data, size, offset);
  }
  absl::StatusOr<int> CreateEventFd() override {
    return target_->CreateEventFd();
  }
  absl::Status SignalEventFd(int fd) override {
    return target_->SignalEventFd(fd);
  }
  absl::StatusOr<uint64_t> DrainEventFd(int fd) override {
    return target_->DrainEventFd(fd);
  }
  absl::StatusOr<int> WaitReadable(const std::vector<int>& fds,
                                   int timeout_ms) override {
    return target_->WaitReadable(fds, timeout_ms);
  }

 private:
  Os* const target_;
};

// Forwards every call to `target` except GetEnv and EnvironmentNames,
// which answer from `env` alone (empty: no variable is set): for tools and
// tests whose outcome must not depend on the environment of whoever runs
// them. The one exception is TPUSHIM_RUN_DIR, which `target` answers when
// `env` does not name it: it says where the processes of a host meet, not
// how this one behaves, and test processes running side by side each keep
// their own (tests/testing/private_run_dir.cc).
class FixedEnvironmentOs : public OsWrapper {
 public:
  explicit FixedEnvironmentOs(Os* target,
                              std::map<std::string, std::string> env = {})
      : OsWrapper(target), env_(std::move(env)) {}

  std::optional<std::string> GetEnv(const std::string& name) override {
    const auto it = env_.find(name);
    if (it == env_.end()) {
      if (name == "TPUSHIM_RUN_DIR") return OsWrapper::GetEnv(name);
      return std::nullopt;
    }
    return it->second;
  }
  std::vector<std::string> EnvironmentNames() override {
    std::vector<std::string> names;
    for (const auto& [name, value] : env_) names.push_back(name);
    return names;
  }

 private:
  const std::map<std::string, std::string> env_;
};

}  // namespace tpushim

#endif  // TPUSHIM_ENV_OS_H_
