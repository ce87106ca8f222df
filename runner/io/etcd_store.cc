#include "runner/io/etcd_store.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>

#include <openssl/ssl.h>

#include <fmt/format.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "base/byte_size.h"
#include "runner/io/etcd_gateway.h"

namespace ddprun::io {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Json = nlohmann::json;
using SteadyTime = std::chrono::steady_clock::time_point;
using etcd::Base64;
using etcd::Decimal;
using etcd::Interpret;
using etcd::Kind;
using etcd::Outcome;
using etcd::ParseUrl;
using etcd::PathOf;
using etcd::ShapeProblem;
using etcd::StringField;
using etcd::Url;

namespace {

// Calls in flight at once (each on its own connection); the rest wait in order. The election
// makes one or two at a time; the margin keeps a renewal from waiting behind a slow write.
constexpr size_t kMaxInFlight = 4;
// Keep-alive connections kept per endpoint for the next calls.
constexpr size_t kMaxIdlePerEndpoint = kMaxInFlight;
// After every endpoint failed once, a call waits this long before the next round (an election
// in etcd takes about its election timeout; hammering does not make it quicker).
constexpr auto kRoundPause = std::chrono::milliseconds(100);
// The answers the store needs are small: the largest is a key's value, written by the store
// in a request of at most kMaxRequestBytes. Anything larger is not etcd answering us.
constexpr uint64_t kMaxBodyBytes = 2u << 20;
// A request body: keys and values of the job's state, well below etcd's own limit (1.5 MiB).
constexpr size_t kMaxRequestBytes = 1u << 20;

/// "3 s", "1.5 s", "250 ms": the bounds as the error texts give them.
std::string Words(std::chrono::nanoseconds d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  if (ms % 1000 == 0) return fmt::format("{} s", ms / 1000);
  if (ms > 1000) return fmt::format("{:.1f} s", static_cast<double>(ms) / 1000.0);
  return fmt::format("{} ms", ms);
}

/// Words for an I/O error of one attempt.
std::string Cause(const error_code& ec) {
  if (ec == asio::error::connection_refused) return "connection refused";
  if (ec == asio::error::connection_reset) return "connection reset";
  if (ec == asio::error::eof || ec == http::error::end_of_stream) return "it closed the connection";
  if (ec == asio::error::host_unreachable) return "host unreachable";
  if (ec == asio::error::network_unreachable) return "network unreachable";
  if (ec == http::error::body_limit) return "an answer over " + ByteSize(kMaxBodyBytes);
  return ec.message();
}

}  // namespace

/// One request of a caller, from its id to its answer.
struct Call {
  explicit Call(asio::io_context& io) : timer(io) {}
  uint64_t id = 0;
  Kind kind = Kind::kGet;
  std::string body;
  SteadyTime deadline;
  enum class State { kReady, kInFlight, kPaused } state = State::kReady;
  size_t next_endpoint = 0;
  size_t tried_this_round = 0;
  std::map<size_t, std::string> errors;  // the last failure at each endpoint tried
  bool answered = false;
  bool reauthenticated = false;
  asio::steady_timer timer;  // the call's deadline while it waits; the end of a pause
};

/// One connection to one endpoint, and the attempt it carries. Handlers hold it by shared_ptr,
/// so that its buffers outlive every operation on them, and the store only by weak_ptr.
struct Conn {
  Conn(asio::io_context& io, size_t endpoint_index, ssl::context* tls_context)
      : endpoint(endpoint_index), socket(io), resolver(io), timer(io) {
    if (tls_context) tls.emplace(io, *tls_context);
  }
  tcp::socket& Socket() { return tls ? tls->next_layer() : socket; }
  void Close() {
    error_code ignored;
    resolver.cancel();
    Socket().shutdown(tcp::socket::shutdown_both, ignored);
    Socket().close(ignored);
    timer.cancel();
  }

  size_t endpoint;
  tcp::socket socket;                           // http
  std::optional<ssl::stream<tcp::socket>> tls;  // https (owns its own socket)
  tcp::resolver resolver;
  asio::steady_timer timer;  // the attempt's limit
  boost::beast::flat_buffer buffer;
  http::request<http::string_body> request;
  std::optional<http::response_parser<http::string_body>> parser;
  std::shared_ptr<Call> call;
  uint64_t attempt = 0;  // bumped per attempt: a late timer of an earlier one does nothing
  bool connected = false;
  bool reused = false;  // this attempt found the connection open from an earlier call
  bool timed_out = false;
  bool authenticating = false;
};

struct EtcdStore::Impl : std::enable_shared_from_this<EtcdStore::Impl> {
  struct Endpoint {
    std::string name;  // the URL as the user wrote it
    Url url;
    std::string token;  // from /v3/auth/authenticate; simple tokens are per member
    std::vector<std::shared_ptr<Conn>> idle;
  };

  Impl(asio::io_context& io_context, Options opts) : io(io_context), options(std::move(opts)) {}

  asio::io_context& io;
  Options options;
  std::optional<ssl::context> tls_context;
  std::vector<Endpoint> endpoints;
  size_t preferred = 0;
  host::StoreEvents* events = nullptr;
  uint64_t next_id = 1;
  bool closed = false;
  std::deque<std::shared_ptr<Call>> ready;
  std::map<uint64_t, std::shared_ptr<Call>> calls;  // every call not yet answered
  std::vector<std::shared_ptr<Conn>> busy;

  std::weak_ptr<Impl> Weak() { return weak_from_this(); }

  uint64_t Submit(Kind kind, Json body) {
    auto call = std::make_shared<Call>(io);
    call->id = next_id++;
    call->kind = kind;
    call->body = body.dump();
    call->deadline = std::chrono::steady_clock::now() + options.call_limit;
    call->next_endpoint = preferred;
    calls.emplace(call->id, call);
    if (call->body.size() > kMaxRequestBytes) {
      Answer(*call,
             ErrorResult(*call, fmt::format("a request of {} bytes is over the {} bytes ddprun sends to etcd",
                                            call->body.size(), kMaxRequestBytes)));
      return call->id;
    }
    ArmDeadline(call);
    ready.push_back(call);
    // Started from the loop, not here: no answer, not even an error, before the call returns.
    asio::post(io, [weak = Weak()] {
      if (auto self = weak.lock()) self->Pump();
    });
    return call->id;
  }

  void ArmDeadline(const std::shared_ptr<Call>& call) {
    call->timer.expires_at(call->deadline);
    call->timer.async_wait([weak = Weak(), call](error_code ec) {
      auto self = weak.lock();
      if (ec || !self || call->answered) return;
      if (call->state == Call::State::kInFlight) return;  // its attempt ends by the deadline too
      self->ready.erase(std::remove(self->ready.begin(), self->ready.end(), call), self->ready.end());
      self->Answer(*call, self->TimedOut(*call));
    });
  }

  host::StoreResult ErrorResult(const Call& call, std::string error) const {
    host::StoreResult result;
    result.id = call.id;
    result.error = std::move(error);
    return result;
  }

  host::StoreResult TimedOut(const Call& call) const {
    std::string causes;
    for (const auto& [index, error] : call.errors) {
      causes += fmt::format("{}etcd at {}: {}", causes.empty() ? "" : "; ", endpoints[index].name, error);
    }
    if (causes.empty()) causes = "the request waited behind others for all that time";
    return ErrorResult(
        call, fmt::format("no etcd endpoint answered within {}: {}", Words(options.call_limit), causes));
  }

  void Answer(Call& call, host::StoreResult result) {
    if (call.answered) return;
    call.answered = true;
    call.timer.cancel();
    result.id = call.id;
    calls.erase(call.id);
    asio::post(io, [weak = Weak(), result = std::move(result)] {
      auto self = weak.lock();
      if (self && !self->closed && self->events) self->events->OnStoreResult(result);
    });
  }

  void Pump() {
    while (!closed && busy.size() < kMaxInFlight && !ready.empty()) {
      auto call = ready.front();
      ready.pop_front();
      if (call->answered) continue;
      Start(call, false);
    }
  }

  /// One attempt of `call` at its next endpoint, on an idle connection there or a new one.
  void Start(const std::shared_ptr<Call>& call, bool fresh) {
    Endpoint& endpoint = endpoints[call->next_endpoint];
    std::shared_ptr<Conn> conn;
    while (!fresh && !endpoint.idle.empty() && !conn) {
      conn = std::move(endpoint.idle.back());
      endpoint.idle.pop_back();
      if (!conn->Socket().is_open()) conn.reset();
    }
    const bool reused = conn != nullptr;
    if (!conn) {
      conn = std::make_shared<Conn>(io, call->next_endpoint, endpoint.url.tls ? &*tls_context : nullptr);
    }
    conn->reused = reused;
    conn->timed_out = false;
    conn->authenticating = false;
    conn->call = call;
    call->state = Call::State::kInFlight;
    busy.push_back(conn);
    const uint64_t attempt = ++conn->attempt;
    const auto limit = std::min(std::chrono::steady_clock::now() + options.attempt_limit, call->deadline);
    conn->timer.expires_at(limit);
    conn->timer.async_wait([conn, attempt](error_code ec) {
      if (ec || conn->attempt != attempt || !conn->call) return;
      conn->timed_out = true;
      conn->Close();  // every operation of the attempt ends now, with an error
    });
    if (conn->connected) {
      Send(conn);
    } else {
      Resolve(conn);
    }
  }

  void Resolve(const std::shared_ptr<Conn>& conn) {
    const Url& url = endpoints[conn->endpoint].url;
    conn->resolver.async_resolve(
        url.host, url.port, [weak = Weak(), conn](error_code ec, tcp::resolver::results_type found) {
          auto self = weak.lock();
          if (!self || self->closed) return;
          if (ec)
            return self->Failed(conn, ec,
                                "cannot resolve " + self->endpoints[conn->endpoint].url.host + ": ");
          asio::async_connect(conn->Socket(), found,
                              [weak, conn](error_code connect_ec, const tcp::endpoint&) {
                                auto me = weak.lock();
                                if (!me || me->closed) return;
                                if (connect_ec) return me->Failed(conn, connect_ec, "");
                                error_code ignored;
                                conn->Socket().set_option(tcp::no_delay(true), ignored);
                                if (conn->tls) return me->Handshake(conn);
                                conn->connected = true;
                                me->Send(conn);
                              });
        });
  }

  void Handshake(const std::shared_ptr<Conn>& conn) {
    const std::string& host = endpoints[conn->endpoint].url.host;
    error_code ec;
    asio::ip::make_address(host, ec);
    if (ec) {  // SNI, for names only; SSL_set_tlsext_host_name spelled out (its macro casts)
      SSL_ctrl(conn->tls->native_handle(), SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(host.c_str()));
    }
    conn->tls->set_verify_mode(ssl::verify_peer);
    conn->tls->set_verify_callback(ssl::host_name_verification(host));
    conn->tls->async_handshake(ssl::stream_base::client, [weak = Weak(), conn](error_code handshake_ec) {
      auto self = weak.lock();
      if (!self || self->closed) return;
      if (handshake_ec) {
        // OpenSSL's error says only "certificate verify failed"; the verify result says why.
        const long verify = SSL_get_verify_result(conn->tls->native_handle());
        const std::string why =
            verify == X509_V_OK ? "" : fmt::format(" ({})", X509_verify_cert_error_string(verify));
        return self->Failed(conn, handshake_ec, "TLS handshake failed" + why + ": ");
      }
      conn->connected = true;
      self->Send(conn);
    });
  }

  /// Writes the call's request (or first the authentication it needs) and reads the answer.
  void Send(const std::shared_ptr<Conn>& conn) {
    Endpoint& endpoint = endpoints[conn->endpoint];
    const bool authenticate = !options.user.empty() && endpoint.token.empty();
    conn->authenticating = authenticate;
    auto& request = conn->request;
    request = {};
    request.method(http::verb::post);
    request.version(11);
    request.keep_alive(true);
    request.set(http::field::host, endpoint.url.host + ":" + endpoint.url.port);
    request.set(http::field::content_type, "application/json");
    if (authenticate) {
      request.target("/v3/auth/authenticate");
      request.body() = Json{{"name", options.user}, {"password", options.password}}.dump();
    } else {
      request.target(PathOf(conn->call->kind));
      if (!endpoint.token.empty()) request.set(http::field::authorization, endpoint.token);
      request.body() = conn->call->body;
    }
    request.prepare_payload();
    conn->parser.emplace();
    conn->parser->body_limit(kMaxBodyBytes);
    auto on_written = [weak = Weak(), conn](error_code ec, size_t) {
      auto self = weak.lock();
      if (!self || self->closed) return;
      if (ec) return self->Failed(conn, ec, "");
      auto on_read = [weak, conn](error_code read_ec, size_t) {
        auto me = weak.lock();
        if (!me || me->closed) return;
        if (read_ec) return me->Failed(conn, read_ec, "");
        me->Received(conn);
      };
      if (conn->tls) {
        http::async_read(*conn->tls, conn->buffer, *conn->parser, std::move(on_read));
      } else {
        http::async_read(conn->socket, conn->buffer, *conn->parser, std::move(on_read));
      }
    };
    if (conn->tls) {
      http::async_write(*conn->tls, conn->request, std::move(on_written));
    } else {
      http::async_write(conn->socket, conn->request, std::move(on_written));
    }
  }

  void Received(const std::shared_ptr<Conn>& conn) {
    const auto& response = conn->parser->get();
    const unsigned status = response.result_int();
    const bool keep = response.keep_alive();
    Endpoint& endpoint = endpoints[conn->endpoint];
    if (conn->authenticating) {
      const Json json =
          ShapeProblem(response.body()).empty() ? Json::parse(response.body(), nullptr, false) : Json();
      const std::string token = status == 200 ? StringField(json, "token") : "";
      if (token.empty()) {
        Outcome outcome = Interpret(conn->call->kind, status == 200 ? 500 : status, response.body());
        if (outcome.type != Outcome::Type::kTryElsewhere) outcome.type = Outcome::Type::kFail;
        outcome.error = fmt::format("cannot authenticate as \"{}\": {}", options.user, outcome.error);
        if (!keep) conn->Close();
        return Finish(conn, std::move(outcome));
      }
      endpoint.token = token;
      if (!keep) {
        // The call goes on a new connection (a TLS stream is not connected twice).
        conn->Close();
        conn->connected = false;
        auto call = conn->call;
        Release(conn);
        return Start(call, true);
      }
      return Send(conn);
    }
    Outcome outcome = Interpret(conn->call->kind, status, response.body());
    if (!keep) {
      conn->Close();
      conn->connected = false;
    }
    Finish(conn, std::move(outcome));
  }

  void Failed(const std::shared_ptr<Conn>& conn, const error_code& ec, const std::string& context) {
    const bool was_connected = conn->connected;
    const bool stale = conn->reused && !conn->timed_out &&
                       (ec == asio::error::eof || ec == http::error::end_of_stream ||
                        ec == asio::error::connection_reset || ec == asio::error::broken_pipe);
    conn->Close();
    conn->connected = false;
    if (stale) {
      // The member closed the idle connection meanwhile (its idle timeout, a restart): the
      // request never reached it, so the same attempt goes on a new connection.
      auto call = conn->call;
      Release(conn);
      return Start(call, true);
    }
    Outcome outcome;
    outcome.type = Outcome::Type::kTryElsewhere;
    if (conn->timed_out) {
      outcome.error = fmt::format("{} within {}", was_connected ? "no answer" : "no connection",
                                  Words(options.attempt_limit));
    } else {
      outcome.error = context + Cause(ec);
    }
    Finish(conn, std::move(outcome));
  }

  /// Takes `conn` off the busy list; keeps it for the next call when it is still open.
  void Release(const std::shared_ptr<Conn>& conn) {
    conn->call.reset();
    ++conn->attempt;
    conn->timer.cancel();
    busy.erase(std::remove(busy.begin(), busy.end(), conn), busy.end());
    auto& idle = endpoints[conn->endpoint].idle;
    if (conn->connected && conn->Socket().is_open() && idle.size() < kMaxIdlePerEndpoint)
      idle.push_back(conn);
  }

  void Finish(const std::shared_ptr<Conn>& conn, Outcome outcome) {
    auto call = conn->call;
    const size_t index = conn->endpoint;
    Release(conn);
    call->state = Call::State::kReady;
    switch (outcome.type) {
      case Outcome::Type::kAnswer:
        preferred = index;
        Answer(*call, std::move(outcome.result));
        break;
      case Outcome::Type::kFail:
        preferred = index;  // it answered, even if with a refusal
        Answer(*call,
               ErrorResult(*call, fmt::format("etcd at {}: {}", endpoints[index].name, outcome.error)));
        break;
      case Outcome::Type::kReauthenticate:
        // The member forgot our token (it restarted; simple tokens live in its memory, for
        // --auth-token-ttl): a new one from the same member, once per call.
        endpoints[index].token.clear();
        if (!call->reauthenticated) {
          call->reauthenticated = true;
          ready.push_front(call);
          break;
        }
        [[fallthrough]];
      case Outcome::Type::kTryElsewhere:
        Retry(call, index, std::move(outcome.error));
        break;
    }
    Pump();
  }

  void Retry(const std::shared_ptr<Call>& call, size_t failed, std::string error) {
    // What an endpoint answered says more than its silence afterwards: a later attempt that
    // only timed out does not hide an earlier refusal (a hostile or broken answer, say).
    std::string& said = call->errors[failed];
    const auto silent = [](const std::string& why) {
      return why.starts_with("no answer within") || why.starts_with("no connection within");
    };
    if (!said.empty() && !silent(said) && silent(error)) {
      if (said.find(" (then ") == std::string::npos) said += " (then " + error + ")";
    } else {
      said = std::move(error);
    }
    const size_t next = (failed + 1) % endpoints.size();
    if (preferred == failed) preferred = next;
    call->next_endpoint = next;
    const auto now = std::chrono::steady_clock::now();
    if (now >= call->deadline) return Answer(*call, TimedOut(*call));
    if (++call->tried_this_round < endpoints.size()) {
      ready.push_front(call);  // it has waited its turn already
      return;
    }
    // Every endpoint failed once: pause before the next round (the deadline timer, re-armed).
    call->tried_this_round = 0;
    call->state = Call::State::kPaused;
    call->timer.expires_at(std::min(now + kRoundPause, call->deadline));
    call->timer.async_wait([weak = Weak(), call](error_code ec) {
      auto self = weak.lock();
      if (ec || !self || call->answered) return;
      if (std::chrono::steady_clock::now() >= call->deadline)
        return self->Answer(*call, self->TimedOut(*call));
      call->state = Call::State::kReady;
      self->ready.push_back(call);
      self->ArmDeadline(call);
      self->Pump();
    });
  }

  void Shutdown() {
    closed = true;
    events = nullptr;
    for (auto& conn : busy) conn->Close();
    for (auto& endpoint : endpoints) {
      for (auto& conn : endpoint.idle) conn->Close();
      endpoint.idle.clear();
    }
    for (auto& [id, call] : calls) call->timer.cancel();
    busy.clear();
    ready.clear();
    calls.clear();
  }
};

EtcdStore::Options EtcdStore::FromSpec(const JobSpec::Rendezvous& rendezvous) {
  Options options;
  options.endpoints = rendezvous.endpoints;
  options.ca_file = rendezvous.ca_file;
  options.cert_file = rendezvous.cert_file;
  options.key_file = rendezvous.key_file;
  options.user = rendezvous.user;
  if (const char* password = std::getenv("DDPRUN_ETCD_PASSWORD")) options.password = password;
  return options;
}

Result<std::unique_ptr<EtcdStore>> EtcdStore::Create(asio::io_context& io, Options options) {
  if (options.endpoints.empty()) return Fail("no etcd endpoints (rendezvous.endpoints)");
  auto impl = std::make_shared<Impl>(io, std::move(options));
  bool any_tls = false;
  for (const std::string& name : impl->options.endpoints) {
    auto url = ParseUrl(name);
    if (!url) return Fail(url.error());
    any_tls = any_tls || url->tls;
    impl->endpoints.push_back(Impl::Endpoint{name, *url, "", {}});
  }
  const Options& o = impl->options;
  if (any_tls) {
    impl->tls_context.emplace(ssl::context::tls_client);
    ssl::context& context = *impl->tls_context;
    error_code ec;
    context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                            ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1,
                        ec);
    if (o.ca_file.empty()) {
      context.set_default_verify_paths(ec);
      if (ec) return Fail("cannot load the system's CA certificates to verify etcd: " + ec.message());
    } else if (context.load_verify_file(o.ca_file, ec); ec) {
      return Fail(fmt::format("rendezvous.ca_file {}: {}", o.ca_file, ec.message()));
    }
    if (o.cert_file.empty() != o.key_file.empty()) {
      return Fail("rendezvous.cert_file and rendezvous.key_file go together: give both or neither");
    }
    if (!o.cert_file.empty()) {
      if (context.use_certificate_chain_file(o.cert_file, ec); ec) {
        return Fail(fmt::format("rendezvous.cert_file {}: {}", o.cert_file, ec.message()));
      }
      if (context.use_private_key_file(o.key_file, ssl::context::pem, ec); ec) {
        return Fail(fmt::format("rendezvous.key_file {}: {}", o.key_file, ec.message()));
      }
    }
  }
  return std::unique_ptr<EtcdStore>(new EtcdStore(std::move(impl)));
}

EtcdStore::EtcdStore(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

EtcdStore::~EtcdStore() { impl_->Shutdown(); }

void EtcdStore::SetEvents(host::StoreEvents* events) { impl_->events = events; }

uint64_t EtcdStore::Grant(Duration ttl) {
  // etcd counts in whole seconds; a part of one is rounded up, and etcd may lengthen it more.
  const auto seconds = std::chrono::ceil<std::chrono::seconds>(ttl).count();
  return impl_->Submit(Kind::kGrant, Json{{"TTL", Decimal(std::max<int64_t>(seconds, 1))}});
}

uint64_t EtcdStore::KeepAlive(int64_t lease) {
  return impl_->Submit(Kind::kKeepAlive, Json{{"ID", Decimal(lease)}});
}

uint64_t EtcdStore::Revoke(int64_t lease) {
  return impl_->Submit(Kind::kRevoke, Json{{"ID", Decimal(lease)}});
}

uint64_t EtcdStore::Get(const std::string& key) {
  return impl_->Submit(Kind::kGet, Json{{"key", Base64(key)}});
}

uint64_t EtcdStore::PutIf(const std::string& key, int64_t create_revision, std::vector<host::StorePut> puts) {
  Json success = Json::array();
  for (const host::StorePut& put : puts) {
    Json request{{"key", Base64(put.key)}, {"value", Base64(put.value)}};
    if (put.lease != 0) request["lease"] = Decimal(put.lease);
    success.push_back(Json{{"request_put", std::move(request)}});
  }
  Json body{
      {"compare", Json::array({Json{{"key", Base64(key)},
                                    {"target", "CREATE"},
                                    {"result", "EQUAL"},
                                    {"create_revision", Decimal(create_revision)}}})},
      {"success", std::move(success)},
      {"failure", Json::array({Json{{"request_range", Json{{"key", Base64(key)}}}}})},
  };
  return impl_->Submit(Kind::kPutIf, std::move(body));
}

std::string EtcdStore::PreferredEndpoint() const { return impl_->endpoints[impl_->preferred].name; }

}  // namespace ddprun::io
