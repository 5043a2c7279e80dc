#include "logging/log_directory.h"

#include <unistd.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tpushim::logging::internal {
namespace {

bool OwnedByUsOrRoot(uid_t owner, uid_t euid) {
  return owner == euid || owner == 0;
}

// `status` with its message prefixed by `what` (the fragment's start).
absl::Status Because(const absl::Status& status, absl::string_view what) {
  return absl::Status(status.code(),
                      absl::StrCat(what, " (", status.ToString(), ")"));
}

// Lstat of `dir`, creating it when it does not exist.
absl::StatusOr<FileInfo> LstatOrCreate(Os& os, const std::string& dir,
                                       mode_t create_mode) {
  absl::StatusOr<FileInfo> info = os.Lstat(dir);
  if (absl::IsNotFound(info.status())) {
    const absl::Status made = os.MakeDirectory(dir, create_mode);
    // ALREADY_EXISTS: someone created it meanwhile; examine what it is.
    if (!made.ok() && !absl::IsAlreadyExists(made)) {
      return Because(
          made, absl::StrCat(dir, " does not exist and cannot be created"));
    }
    info = os.Lstat(dir);
  }
  if (!info.ok()) {
    return Because(info.status(), absl::StrCat(dir, " cannot be examined"));
  }
  return info;
}

}  // namespace

absl::Status PrepareLogDirectory(Os& os, const std::string& dir,
                                 mode_t create_mode) {
  absl::StatusOr<FileInfo> info = LstatOrCreate(os, dir, create_mode);
  if (!info.ok()) return info.status();
  const uid_t euid = os.EffectiveUid();
  if (info->type == FileInfo::Type::kSymlink) {
    if (!OwnedByUsOrRoot(info->owner, euid)) {
      return absl::PermissionDeniedError(
          absl::StrCat(dir, " is a symlink owned by uid ", info->owner,
                       ", not by you (uid ", euid, ") or root"));
    }
    info = os.Stat(dir);
    if (!info.ok()) {
      return Because(
          info.status(),
          absl::StrCat(dir, " is a symlink that cannot be followed"));
    }
    if (info->type != FileInfo::Type::kDirectory) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir,
                       " is a symlink to something that is not a "
                       "directory"));
    }
  } else if (info->type != FileInfo::Type::kDirectory) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is not a directory"));
  }
  if (!OwnedByUsOrRoot(info->owner, euid)) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, " is owned by uid ", info->owner,
                     ", not by you (uid ", euid, ")"));
  }
  const absl::Status access = os.Access(dir, W_OK | X_OK);
  if (!access.ok()) {
    return Because(access, absl::StrCat(dir, " is not writable"));
  }
  return absl::OkStatus();
}

std::string FallbackLogDirectory(Os& os) {
  return absl::StrCat("/tmp/tpu_logs_", os.UserName());
}

LogDirectoryChoice ChooseLogDirectory(Os& os, const std::string& configured) {
  if (configured.empty()) return {};
  const absl::Status status = PrepareLogDirectory(os, configured, 0755);
  if (status.ok()) return {configured, ""};

  const std::string fallback = FallbackLogDirectory(os);
  const std::string what = absl::StrCat("Log directory ", status.message());
  if (fallback == configured) {
    return {"", absl::StrCat(what, "; logging to stderr only")};
  }
  const absl::Status fallback_status = PrepareLogDirectory(os, fallback, 0700);
  if (fallback_status.ok()) {
    return {fallback,
            absl::StrCat(what, "; logging to ", fallback, " instead")};
  }
  return {"",
          absl::StrCat(what, "; fallback log directory ",
                       fallback_status.message(), "; logging to stderr only")};
}

}  // namespace tpushim::logging::internal
