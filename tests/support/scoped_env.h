#pragma once
// One environment variable set (or unset) for the length of a scope, and put back as it was:
// for tests of code that reads the environment (the node rank, the shared secret).
//
// Header only: every test binary already has the source tree on its include path.

#include <cstdlib>
#include <optional>
#include <string>

namespace ddprun::test {

class ScopedEnv {
 public:
  /// `value` nullptr unsets `name`.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace ddprun::test
