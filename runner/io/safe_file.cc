#include "runner/io/safe_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/byte_size.h"

namespace ddprun::io {
namespace {

/// "a FIFO", "a symbolic link", ...: what a file of `mode` is, for messages.
const char* KindOf(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a folder";
  return "an unknown kind of file";
}

/// Why `name` in `dir_fd` could not be opened as `expected` ("a regular file", "a folder")
/// after `error`: what is in its place, when that is something else, else the system's words.
/// `what` names it in the message.
std::string DescribeFailure(int dir_fd, const std::string& name, const std::string& what,
                            const char* expected, int error) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      std::string_view(KindOf(st.st_mode)) != expected) {
    return fmt::format("{} is {}, not {}", what, KindOf(st.st_mode), expected);
  }
  return fmt::format("cannot open {}: {}", what, std::strerror(error));
}

}  // namespace

Result<std::optional<UniqueFd>> OpenRegularFile(int dir_fd, std::string_view relative,
                                                const std::string& shown) {
  // Each folder on the way is opened from the one before it: a link anywhere would lead elsewhere.
  UniqueFd folder;
  int at = dir_fd;
  for (size_t slash = relative.find('/'); slash != std::string_view::npos; slash = relative.find('/')) {
    const std::string part(relative.substr(0, slash));
    relative.remove_prefix(slash + 1);
    if (part.empty()) continue;  // "a//b"
    UniqueFd next(::openat(at, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) {
      const int error = errno;
      if (error == ENOENT) return std::optional<UniqueFd>();
      return Fail(
          DescribeFailure(at, part, fmt::format("{} (on the way to {})", part, shown), "a folder", error));
    }
    folder = std::move(next);
    at = folder.get();
  }
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
  // O_NOCTTY: a terminal planted here does not become the agent's.
  const std::string name(relative);
  UniqueFd fd(::openat(at, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) {
    const int error = errno;
    if (error == ENOENT) return std::optional<UniqueFd>();
    return Fail(DescribeFailure(at, name, shown, "a regular file", error));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return Fail(fmt::format("cannot read {}: {}", shown, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    return Fail(fmt::format("{} is {}, not a regular file", shown, KindOf(st.st_mode)));
  // A regular file ignores O_NONBLOCK; it is cleared all the same, so that reads block as they
  // would on any file, whatever the file system.
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return std::optional<UniqueFd>(std::move(fd));
}

Result<std::optional<std::string>> ReadRegularFile(int dir_fd, std::string_view relative,
                                                   const std::string& shown, size_t max_bytes) {
  auto opened = OpenRegularFile(dir_fd, relative, shown);
  if (!opened) return Fail(opened.error());
  if (!*opened) return std::optional<std::string>();
  const int fd = (*opened)->get();
  auto too_large = [&] { return Fail(fmt::format("{} is larger than {}", shown, ByteSize(max_bytes))); };
  struct stat st {};
  if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) > max_bytes) return too_large();
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));
  char piece[16 * 1024];
  while (true) {
    const ssize_t n = ::read(fd, piece, sizeof piece);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Fail(fmt::format("cannot read {}: {}", shown, std::strerror(errno)));
    if (n == 0) break;
    text.append(piece, static_cast<size_t>(n));
    if (text.size() > max_bytes) return too_large();  // it grew since fstat
  }
  return std::optional<std::string>(std::move(text));
}

Status ReplaceFile(int dir_fd, const std::string& shown, const std::string& name, std::string_view text) {
  const std::string temp = name + ".new";
  const std::string temp_shown = shown + "/" + temp;
  // Whatever is under the temporary name (a crash's leftover, or something planted) goes first,
  // so that O_EXCL makes a new regular file: never a FIFO opened, never a link followed.
  if (::unlinkat(dir_fd, temp.c_str(), 0) != 0 && errno != ENOENT) {
    return Fail(fmt::format("cannot remove {}: {}", temp_shown, std::strerror(errno)));
  }
  UniqueFd fd(::openat(dir_fd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return Fail(fmt::format("cannot write {}: {}", temp_shown, std::strerror(errno)));
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return Fail(fmt::format("cannot write {}: {}", temp_shown, std::strerror(n < 0 ? errno : ENOSPC)));
    written += static_cast<size_t>(n);
  }
  // NFS may report a failed write only when the file is closed.
  if (fd.Reset() != 0) return Fail(fmt::format("cannot write {}: {}", temp_shown, std::strerror(errno)));
  if (::renameat(dir_fd, temp.c_str(), dir_fd, name.c_str()) != 0) {
    return Fail(fmt::format("cannot rename {} to {}: {}", temp_shown, name, std::strerror(errno)));
  }
  return {};
}

}  // namespace ddprun::io
