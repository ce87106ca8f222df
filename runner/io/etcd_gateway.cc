#include "runner/io/etcd_gateway.h"

#include <algorithm>
#include <charconv>

#include <openssl/evp.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ddprun::io::etcd {

using Json = nlohmann::json;

namespace {

// The shape of any answer of the gateway: a txn's range answer is the deepest,
// {"responses":[{"response_range":{"kvs":[{...}]}}]}, 6 levels, and none has more than a few
// dozen values. A JSON parser builds a tree of whatever it is given (4 MB of "[[[[" take an
// agent to hundreds of MB), so the shape is checked before parsing.
constexpr int kMaxAnswerDepth = 16;
constexpr size_t kMaxAnswerValues = 4096;

// gRPC status codes (the gateway's "code"), those that say one member could not serve the
// request now while another may.
constexpr int kCodeNotFound = 5;
constexpr int kCodeUnauthenticated = 16;
bool TryElsewhere(int code) {
  return code == 2 /* unknown */ || code == 4 /* deadline exceeded */ || code == 8 /* exhausted */ ||
         code == 10 /* aborted */ || code == 13 /* internal */ || code == 14 /* unavailable */;
}

// The gateway writes int64 fields as JSON strings and leaves out fields that are zero.
int64_t Int64Field(const Json& object, const char* name) {
  if (!object.is_object()) return 0;
  const auto it = object.find(name);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  const std::string& text = it->get_ref<const std::string&>();
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size() ? value : 0;
}

/// An etcd entry of a range answer ("kvs": [...]).
std::optional<host::StoreEntry> EntryOf(const Json& kvs) {
  if (!kvs.is_array() || kvs.empty()) return std::nullopt;
  const Json& kv = kvs.front();
  host::StoreEntry entry;
  const auto value = Unbase64(StringField(kv, "value"));
  if (!value) return std::nullopt;
  entry.value = *value;
  entry.create_revision = Int64Field(kv, "create_revision");
  entry.mod_revision = Int64Field(kv, "mod_revision");
  entry.lease = Int64Field(kv, "lease");
  return entry;
}

}  // namespace

const char* PathOf(Kind kind) {
  switch (kind) {
    case Kind::kGrant:
      return "/v3/lease/grant";
    case Kind::kKeepAlive:
      return "/v3/lease/keepalive";
    case Kind::kRevoke:
      return "/v3/lease/revoke";
    case Kind::kGet:
      return "/v3/kv/range";
    case Kind::kPutIf:
      return "/v3/kv/txn";
  }
  return "";
}

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

std::optional<std::string> Unbase64(std::string_view text) {
  if (text.empty()) return std::string();
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out(3 * text.size() / 4, '\0');
  const int n =
      EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t padding = 0;
  if (text.back() == '=') ++padding;
  if (text.size() >= 2 && text[text.size() - 2] == '=') ++padding;
  out.resize(static_cast<size_t>(n) - padding);
  return out;
}

std::string Decimal(int64_t n) { return std::to_string(n); }

std::string StringField(const Json& object, const char* name) {
  if (!object.is_object()) return "";
  const auto it = object.find(name);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string ShapeProblem(std::string_view body) {
  int depth = 0;
  size_t values = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxAnswerDepth) {
        return fmt::format("an answer nested more than {} deep, which etcd never sends", kMaxAnswerDepth);
      }
      ++values;
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == ',') {
      ++values;
    }
    if (values > kMaxAnswerValues) {
      return fmt::format("an answer of more than {} values, which etcd never sends", kMaxAnswerValues);
    }
  }
  return "";
}

Outcome Interpret(Kind kind, unsigned status, const std::string& body) {
  Outcome out;
  if (std::string problem = ShapeProblem(body); !problem.empty()) {
    out.type = Outcome::Type::kTryElsewhere;
    out.error = std::move(problem);
    return out;
  }
  Json json = Json::parse(body, nullptr, false);
  // A unary error: {"error": "...", "message": "...", "code": 14}; a streaming one (keepalive):
  // {"error": {"grpc_code": 14, "http_code": 503, "message": "...", ...}}.
  const Json* error = nullptr;
  if (json.is_object() && json.contains("error")) error = &json["error"];
  if (status != 200 || error) {
    int code = 0;
    std::string message;
    if (error && error->is_object()) {
      code = static_cast<int>(Int64Field(*error, "grpc_code"));
      message = StringField(*error, "message");
    } else if (error) {
      code = static_cast<int>(Int64Field(json, "code"));
      message = StringField(json, "message");
      if (message.empty()) message = StringField(json, "error");
    }
    if (kind == Kind::kRevoke && code == kCodeNotFound) return out;  // the lease is gone already
    if (message.empty()) message = status == 200 ? "an answer that is not JSON" : "no reason given";
    out.error = status == 200 ? message : fmt::format("{} (HTTP {})", message, status);
    if (code == kCodeUnauthenticated) {
      out.type = Outcome::Type::kReauthenticate;
    } else if (TryElsewhere(code) || (code == 0 && status >= 500)) {
      out.type = Outcome::Type::kTryElsewhere;
    } else {
      out.type = Outcome::Type::kFail;
    }
    return out;
  }
  if (!json.is_object()) {
    out.type = Outcome::Type::kTryElsewhere;
    out.error = "an answer that is not JSON";
    return out;
  }
  const Json& payload = kind == Kind::kKeepAlive && json.contains("result") ? json["result"] : json;
  host::StoreResult& result = out.result;
  result.revision = Int64Field(payload.value("header", Json::object()), "revision");
  switch (kind) {
    case Kind::kGrant:
      result.lease = Int64Field(payload, "ID");
      result.ttl = std::chrono::seconds(Int64Field(payload, "TTL"));
      if (result.lease == 0) {
        out.type = Outcome::Type::kFail;
        out.error = "granted no lease";
      }
      break;
    case Kind::kKeepAlive:
      result.lease = Int64Field(payload, "ID");
      result.ttl = std::chrono::seconds(std::max<int64_t>(Int64Field(payload, "TTL"), 0));
      break;
    case Kind::kRevoke:
      break;
    case Kind::kGet:
      result.entry = EntryOf(payload.value("kvs", Json::array()));
      break;
    case Kind::kPutIf: {
      result.succeeded = payload.value("succeeded", false);
      if (!result.succeeded) {
        const Json responses = payload.value("responses", Json::array());
        if (responses.is_array() && !responses.empty() && responses.front().is_object()) {
          const Json range = responses.front().value("response_range", Json::object());
          result.entry = EntryOf(range.is_object() ? range.value("kvs", Json::array()) : Json::array());
        }
      }
      break;
    }
  }
  return out;
}

Result<Url> ParseUrl(const std::string& text) {
  Url url;
  std::string_view rest = text;
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.starts_with("https://")) {
    url.tls = true;
    rest.remove_prefix(8);
  } else {
    return Fail(fmt::format("etcd endpoint \"{}\" is not an http:// or https:// URL", text));
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    if (rest.substr(slash) != "/") {
      return Fail(fmt::format("etcd endpoint \"{}\" has a path; give scheme, host and port only", text));
    }
    rest = rest.substr(0, slash);
  }
  std::string_view port;
  if (rest.starts_with("[")) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return Fail(fmt::format("etcd endpoint \"{}\": no closing ]", text));
    url.host = std::string(rest.substr(1, close - 1));
    rest.remove_prefix(close + 1);
    if (rest.starts_with(":"))
      port = rest.substr(1);
    else if (!rest.empty())
      return Fail(fmt::format("etcd endpoint \"{}\" is not host:port", text));
  } else if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    url.host = std::string(rest.substr(0, colon));
    port = rest.substr(colon + 1);
  } else {
    url.host = std::string(rest);
  }
  url.port = port.empty() ? "2379" : std::string(port);
  unsigned number = 0;
  const auto [end, ec] = std::from_chars(url.port.data(), url.port.data() + url.port.size(), number);
  if (url.host.empty() || ec != std::errc() || end != url.port.data() + url.port.size() || number == 0 ||
      number > 65535) {
    return Fail(fmt::format("etcd endpoint \"{}\" is not scheme://host:port", text));
  }
  return url;
}

}  // namespace ddprun::io::etcd
