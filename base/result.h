#pragma once
// The one error shape of every layer (schema, host, io, preflight, cli): a value, or why there
// is none, in words for the user. The reason is a sentence that names what failed and what to
// do; callers add context by wrapping it, never by parsing it. Exceptions stay inside the
// libraries that throw them (toml++, Asio): each boundary turns them into a Result.
//
//   Result<UniqueFd> OpenLog(...);
//   auto log = OpenLog(...);
//   if (!log) return Fail("cannot write the rank log: " + log.error());
//   Use(*log);

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "base/assert.h"

namespace ddprun {

/// Why an operation failed; convertible into any Result.
struct Error {
  std::string reason;
};

inline Error Fail(std::string reason) { return Error{std::move(reason)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}          // NOLINT: implicit
  Result(Error failure) : state_(std::in_place_index<1>, std::move(failure)) {}  // NOLINT

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    DDPRUN_ASSERT(ok());
    return std::get<0>(state_);
  }
  const T& value() const& {
    DDPRUN_ASSERT(ok());
    return std::get<0>(state_);
  }
  T&& value() && {
    DDPRUN_ASSERT(ok());
    return std::get<0>(std::move(state_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The reason; only for a failed Result.
  const std::string& error() const {
    DDPRUN_ASSERT(!ok());
    return std::get<1>(state_).reason;
  }

 private:
  std::variant<T, Error> state_;
};

/// A Result without a value: done, or why not.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error failure) : failure_(std::move(failure)) {}  // NOLINT: implicit

  bool ok() const { return !failure_; }
  explicit operator bool() const { return ok(); }
  const std::string& error() const {
    DDPRUN_ASSERT(!ok());
    return failure_->reason;
  }

 private:
  std::optional<Error> failure_;
};

using Status = Result<void>;

}  // namespace ddprun
