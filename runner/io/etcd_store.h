#pragma once
// The real host::Store (rendezvous.backend = "etcd"): etcd's v3 API through its JSON gateway
// (HTTP/1.1 POSTs of JSON to /v3/lease/*, /v3/kv/range, /v3/kv/txn), on the driver's one
// io_context. Bounded: each attempt at one endpoint, and each call as a whole, has a limit; a
// call that no endpoint answers within its limit is answered with an error that names every
// endpoint tried and why it failed. A few calls are in flight at once over keep-alive
// connections, the rest wait in order. Boost.Beast and TLS stay in etcd_store.cc; what the
// gateway's JSON says is etcd_gateway.h.

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "runner/host/ports.h"
#include "schema/job_spec.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

class EtcdStore final : public host::Store {
 public:
  struct Options {
    std::vector<std::string> endpoints;  // "http://10.0.0.1:2379", "https://etcd-0:2379"
    std::string ca_file;                 // https: the CA that signed etcd's certificate ("": the system's)
    std::string cert_file;               // https: a client certificate, and its key
    std::string key_file;
    std::string user;  // "" : no authentication
    std::string password;
    /// One try at one endpoint: connect, (TLS, authenticate,) send, read the answer.
    Duration attempt_limit = Seconds(1);
    /// A call as a whole, from the call to its answer, every endpoint tried in turn.
    Duration call_limit = Seconds(3);
  };

  /// The options of a job's [rendezvous] table, the password from DDPRUN_ETCD_PASSWORD.
  static Options FromSpec(const JobSpec::Rendezvous& rendezvous);

  /// Fails, in words for the user, when an endpoint is not an http(s) URL or the TLS files
  /// cannot be loaded. Connects nothing yet.
  static Result<std::unique_ptr<EtcdStore>> Create(boost::asio::io_context& io, Options options);

  /// Closes every connection; calls not yet answered are never answered, and handlers still
  /// queued on the io_context find the store gone and do nothing.
  ~EtcdStore() override;
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  void SetEvents(host::StoreEvents* events) override;
  uint64_t Grant(Duration ttl) override;
  uint64_t KeepAlive(int64_t lease) override;
  uint64_t Revoke(int64_t lease) override;
  uint64_t Get(const std::string& key) override;
  uint64_t PutIf(const std::string& key, int64_t create_revision, std::vector<host::StorePut> puts) override;

  /// The endpoint the next call tries first: the last one that answered, or the one after the
  /// last that failed. For tests and diagnostics.
  std::string PreferredEndpoint() const;

  struct Impl;

 private:
  explicit EtcdStore(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddprun::io
