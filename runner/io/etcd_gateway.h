#pragma once
// etcd's v3 JSON gateway as EtcdStore speaks it, without any I/O: the calls and their paths,
// keys and values in base64, int64 fields written as JSON strings, an answer's shape checked
// before it is parsed (a peer's 4 MB of "[[[[" never reaches the JSON parser), what an answer
// means for its call, and the endpoints' URLs. etcd_store.cc carries the calls over HTTP.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "base/result.h"
#include "runner/host/ports.h"

namespace ddprun::io::etcd {

/// The calls the store makes.
enum class Kind { kGrant, kKeepAlive, kRevoke, kGet, kPutIf };
/// The gateway's path for a call ("/v3/kv/range").
const char* PathOf(Kind kind);

/// Keys and values travel in base64. Unbase64 is nullopt for text that is not base64.
std::string Base64(std::string_view bytes);
std::optional<std::string> Unbase64(std::string_view text);
/// An int64 as the gateway takes it: a JSON string of its digits.
std::string Decimal(int64_t n);
/// `object`'s string field `name`; "" when `object` is not an object, or it has no such string.
std::string StringField(const nlohmann::json& object, const char* name);

/// Why `body` cannot be an answer of the gateway, found without parsing it: nested more than
/// 16 deep or more than 4096 values, counted outside strings. "" when it may be one.
std::string ShapeProblem(std::string_view body);

/// What an attempt's answer means for its call.
struct Outcome {
  enum class Type { kAnswer, kTryElsewhere, kFail, kReauthenticate };
  Type type = Type::kAnswer;
  host::StoreResult result;  // kAnswer
  std::string error;         // the others: why, without the endpoint
};
/// Reads one answer of the gateway: `status` and `body` of the HTTP response to a `kind` call.
/// A member that cannot serve now (unavailable, an election, a 5xx, an answer of the wrong
/// shape) is kTryElsewhere; an expired token kReauthenticate; revoking a lease that is gone
/// already is an answer.
Outcome Interpret(Kind kind, unsigned status, const std::string& body);

/// An endpoint as the user wrote it, "http://10.0.0.1:2379" or "https://[fd00::1]" (port 2379).
struct Url {
  bool tls = false;
  std::string host;  // without brackets
  std::string port;
};
/// Fails, in words for the user, for anything but scheme://host[:port][/].
Result<Url> ParseUrl(const std::string& text);

}  // namespace ddprun::io::etcd
