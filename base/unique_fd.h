#pragma once
// A file descriptor with one owner: closed when the owner goes, so no early return leaks one.

#include <unistd.h>

#include <utility>

namespace ddprun {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(other.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int Release() { return std::exchange(fd_, -1); }
  /// Closes the current descriptor (if any) and owns `fd`. Returns close(2)'s result for the
  /// old one (0 when there was none): on NFS a failed write may only show here.
  int Reset(int fd = -1) {
    int result = 0;
    if (fd_ >= 0) result = ::close(fd_);
    fd_ = fd;
    return result;
  }

 private:
  int fd_ = -1;
};

}  // namespace ddprun
