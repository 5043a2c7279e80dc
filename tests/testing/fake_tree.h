// A made-up file tree (files, symbolic links, directories, unreadable
// paths) that tests put in front of code reading sysfs and procfs through
// the Os layer, and FakeTreeOs, an Os that shows it.
//
// Directories need not be declared: a path is a directory when anything
// lies below it. Paths outside the tree do not exist (NOT_FOUND), so the
// real /sys and /proc never leak into a test.
//
//   FakeTree tree = FakeTree::QuietHost();
//   tree.Link("/sys/class/block/vda",
//             "../../devices/pci0000:00/0000:00:02.0/virtio1/block/vda")
//       .File("/proc/self/mountinfo", "22 1 254:0 / / rw - ext4 /dev/vda
//       rw\n");
//   FakeTreeOs os(tree);

#ifndef TPUSHIM_TESTS_TESTING_FAKE_TREE_H_
#define TPUSHIM_TESTS_TESTING_FAKE_TREE_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "env/os.h"

namespace tpushim {

class FakeTree {
 public:
  FakeTree& File(const std::string& path, std::string contents) {
    files_[path] = std::move(contents);
    return *this;
  }
  FakeTree& Link(const std::string& path, std::string target) {
    links_[path] = std::move(target);
    return *this;
  }
  FakeTree& Dir(const std::string& path) {
    dirs_.insert(path);
    return *this;
  }
  // Every read of `path` (file, link or listing) fails with `status`.
  FakeTree& Fail(const std::string& path, absl::Status status) {
    failures_[path] = std::move(status);
    return *this;
  }
  // Removes `path` and everything below it.
  FakeTree& Remove(const std::string& path) {
    auto gone = [&](const std::string& entry) {
      return entry == path || absl::StartsWith(entry, path + "/");
    };
    std::erase_if(files_, [&](const auto& entry) { return gone(entry.first); });
    std::erase_if(links_, [&](const auto& entry) { return gone(entry.first); });
    std::erase_if(dirs_, gone);
    return *this;
  }

  // A host with nothing of interest: empty block, network and USB classes,
  // the root file system on a disk that is not in the tree, no swap.
  static FakeTree QuietHost() {
    FakeTree tree;
    tree.Dir("/sys/class/block")
        .Dir("/sys/class/net")
        .File("/proc/self/mountinfo",
              "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
              "23 22 0:21 / /proc rw shared:2 - proc proc rw\n")
        .File("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n")
        .File("/proc/net/route",
              "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\n");
    return tree;
  }

  // nullopt: the tree has nothing to say about `path`.
  std::optional<absl::StatusOr<std::string>> ReadFile(
      const std::string& path) const {
    if (auto failure = Failure(path)) return *failure;
    if (auto it = files_.find(path); it != files_.end()) return it->second;
    return std::nullopt;
  }
  std::optional<absl::StatusOr<std::string>> ReadLink(
      const std::string& path) const {
    if (auto failure = Failure(path)) return *failure;
    if (auto it = links_.find(path); it != links_.end()) return it->second;
    return std::nullopt;
  }
  std::optional<absl::StatusOr<std::vector<std::string>>> ListDirectory(
      const std::string& path) const {
    if (auto failure = Failure(path)) return *failure;
    std::set<std::string> names;
    bool exists = dirs_.contains(path);
    const std::string prefix = path + "/";
    auto collect = [&](const std::string& entry) {
      if (!absl::StartsWith(entry, prefix)) return;
      exists = true;
      const std::string rest = entry.substr(prefix.size());
      names.insert(rest.substr(0, rest.find('/')));
    };
    for (const auto& [entry, contents] : files_) collect(entry);
    for (const auto& [entry, target] : links_) collect(entry);
    for (const std::string& entry : dirs_) collect(entry);
    for (const auto& [entry, status] : failures_) collect(entry);
    if (!exists) return std::nullopt;
    return std::vector<std::string>(names.begin(), names.end());
  }
  bool Exists(const std::string& path) const {
    return files_.contains(path) || links_.contains(path) ||
           ListDirectory(path).has_value();
  }

 private:
  std::optional<absl::Status> Failure(const std::string& path) const {
    if (auto it = failures_.find(path); it != failures_.end()) {
      return it->second;
    }
    return std::nullopt;
  }

  std::map<std::string, std::string> files_;
  std::map<std::string, std::string> links_;
  std::set<std::string> dirs_;
  std::map<std::string, absl::Status> failures_;
};

inline absl::Status NoSuchPath(absl::string_view call,
                               const std::string& path) {
  return absl::NotFoundError(
      absl::StrCat(call, "(", path, "): No such file or directory"));
}

// An Os whose files are the tree's: every path under one of `owned` is
// answered by the tree alone (NOT_FOUND when it has nothing), every other
// path and call by the real Os.
class FakeTreeOs : public OsWrapper {
 public:
  explicit FakeTreeOs(FakeTree tree, std::vector<std::string> owned = {"/"})
      : OsWrapper(Os::Default()),
        tree_(std::move(tree)),
        owned_(std::move(owned)) {}

  FakeTree& tree() { return tree_; }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    if (!Owned(path)) return OsWrapper::ReadFile(path);
    if (auto answer = tree_.ReadFile(path)) return *answer;
    return NoSuchPath("open", path);
  }
  absl::StatusOr<std::string> ReadLink(const std::string& path) override {
    if (!Owned(path)) return OsWrapper::ReadLink(path);
    if (auto answer = tree_.ReadLink(path)) return *answer;
    if (tree_.ReadFile(path).has_value() ||
        tree_.ListDirectory(path).has_value()) {
      // readlink(2) of something that is not a link: EINVAL.
      return absl::InvalidArgumentError(
          absl::StrCat("readlink(", path, "): Invalid argument"));
    }
    return NoSuchPath("readlink", path);
  }
  absl::StatusOr<std::vector<std::string>> ListDirectory(
      const std::string& path) override {
    if (!Owned(path)) return OsWrapper::ListDirectory(path);
    if (auto answer = tree_.ListDirectory(path)) return *answer;
    return NoSuchPath("opendir", path);
  }
  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    if (!Owned(path)) return OsWrapper::Stat(path);
    if (tree_.ListDirectory(path).has_value()) {
      return FileInfo{.type = FileInfo::Type::kDirectory, .mode = 0755};
    }
    if (tree_.ReadFile(path).has_value()) {
      return FileInfo{.type = FileInfo::Type::kRegular, .mode = 0644};
    }
    return NoSuchPath("stat", path);
  }

 private:
  bool Owned(const std::string& path) const {
    for (const std::string& prefix : owned_) {
      if (absl::StartsWith(path, prefix)) return true;
    }
    return false;
  }

  FakeTree tree_;
  std::vector<std::string> owned_;
};

}  // namespace tpushim

#endif  // TPUSHIM_TESTS_TESTING_FAKE_TREE_H_
