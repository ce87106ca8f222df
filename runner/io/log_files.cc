#include "runner/io/log_files.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>

#include <fmt/format.h>

namespace ddprun::io {
namespace {

/// Why an open of `name` in `dir_fd` (shown as `path`) failed, for the user.
std::string DescribeOpenFailure(int dir_fd, const std::string& name, const std::string& path, int error) {
  struct stat st {};
  if ((error == ELOOP || error == ENOTDIR || error == EEXIST) &&
      ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
    return fmt::format(
        "{} is a symbolic link; ddprun follows no link below logs.dir (someone may "
        "have planted it to make ddprun write elsewhere)",
        path);
  }
  if (error == EEXIST) {
    return fmt::format("{} exists already; ddprun writes only files it created in this run", path);
  }
  if (error == ENOTDIR) return fmt::format("{} is not a folder", path);
  return fmt::format("cannot create {}: {}", path, std::strerror(error));
}

std::vector<std::string> PathComponents(const std::string& relative) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= relative.size()) {
    size_t end = relative.find('/', start);
    if (end == std::string::npos) end = relative.size();
    if (end > start) parts.push_back(relative.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

/// Opens (creating if missing) each of `parts[0..count)` in turn below `dir_fd`.
UniqueFd OpenParts(int dir_fd, std::string& path, const std::vector<std::string>& parts, size_t count,
                   bool last_must_be_new, std::string& error) {
  UniqueFd dir;
  int current = dir_fd;
  for (size_t i = 0; i < count; ++i) {
    const std::string& name = parts[i];
    path += "/" + name;
    const bool must_be_new = last_must_be_new && i + 1 == count;
    if (::mkdirat(current, name.c_str(), 0755) != 0 && (errno != EEXIST || must_be_new)) {
      error = DescribeOpenFailure(current, name, path, errno);
      return UniqueFd();
    }
    UniqueFd next(::openat(current, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) {
      error = DescribeOpenFailure(current, name, path, errno);
      return UniqueFd();
    }
    dir = std::move(next);
    current = dir.get();
  }
  // No part: the caller's own folder, as a descriptor of its own.
  if (!dir.valid()) dir = UniqueFd(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
  return dir;
}

}  // namespace

Result<UniqueFd> OpenFolderBelow(int dir_fd, const std::string& shown, const std::string& relative,
                                 bool last_must_be_new) {
  const std::vector<std::string> parts = PathComponents(relative);
  std::string path = shown;
  std::string error;
  UniqueFd dir = OpenParts(dir_fd, path, parts, parts.size(), last_must_be_new, error);
  if (!dir.valid()) return Fail(error);
  return dir;
}

Result<UniqueFd> CreateFileBelow(int dir_fd, const std::string& shown, const std::string& relative) {
  const std::vector<std::string> parts = PathComponents(relative);
  if (parts.empty()) return Fail("no file name");
  std::string path = shown;
  std::string error;
  UniqueFd dir = OpenParts(dir_fd, path, parts, parts.size() - 1, false, error);
  if (!dir.valid()) return Fail(error);
  path += "/" + parts.back();
  // O_EXCL: never over an existing file; with O_CREAT it also refuses a link in its place.
  UniqueFd fd(
      ::openat(dir.get(), parts.back().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return Fail(DescribeOpenFailure(dir.get(), parts.back(), path, errno));
  return fd;
}

}  // namespace ddprun::io
