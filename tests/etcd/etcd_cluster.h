#pragma once
// A real etcd cluster for tests: members on 127.0.0.1 (ports the caller hands out, data in a
// fresh temp dir), short heartbeat and election timeouts so that an election takes about a
// second. A test can find the leader, kill -9 a member and start it again; the destructor
// kills every process it started, by pid, and removes the data.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::etcdtest {

class EtcdCluster {
 public:
  struct Options {
    int members = 3;
    /// A TCP port on 127.0.0.1 that is free and no other test takes (tests/e2e FreePort).
    std::function<uint16_t()> free_port;
    std::string etcd = "etcd";  // looked up in PATH
    std::chrono::milliseconds heartbeat{100};
    std::chrono::milliseconds election{1000};
    /// Start() waits this long for every member to be up and to agree on a leader.
    std::chrono::milliseconds start_limit{30000};
    /// Clients speak https and must show a certificate: a CA, a server certificate for
    /// 127.0.0.1 and a client certificate are made with the openssl program (peers stay http).
    bool tls = false;
    /// The address every member listens on (an IPv4 address of this host, or of the network
    /// namespace the test runs in).
    std::string host = "127.0.0.1";
  };

  /// Starts the members and waits until the cluster is healthy; nullopt and `error` (what
  /// went wrong, with the members' logs) if it is not within the limit.
  static std::unique_ptr<EtcdCluster> Start(Options options, std::string* error);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  /// "http://127.0.0.1:port" of member i; every member's, in order.
  const std::string& ClientUrl(int member) const;
  std::vector<std::string> ClientUrls() const;
  /// The member whose client URL is `url`; -1 if none.
  int MemberOf(const std::string& url) const;
  pid_t pid(int member) const;
  /// With Options::tls: the CA that signed every certificate, and a client's certificate and key.
  std::string ca_file() const { return dir_ + "/ca.pem"; }
  std::string client_cert_file() const { return dir_ + "/client.pem"; }
  std::string client_key_file() const { return dir_ + "/client.key"; }
  bool Running(int member) const;

  /// The member that is leader now, as the running members agree (polled up to `limit`);
  /// nullopt when they do not agree on a running leader within it.
  std::optional<int> Leader(std::chrono::milliseconds limit) const;
  /// Every running member is up, they agree on a leader, and a linearizable read succeeds.
  bool WaitHealthy(std::chrono::milliseconds limit) const;

  /// SIGKILL to member i, and reaped.
  void Kill(int member);
  /// Starts member i again on its data and ports; false if its process could not be started.
  bool Restart(int member);

  /// The log of member i (its stdout and stderr), for failure messages.
  std::string Log(int member) const;
  std::string Logs() const;

  /// One blocking HTTP/1.0 POST of `body` to `path` of member i (over plain http on a port of
  /// its own when clients speak https); the answer's body
  /// if the status is 200, nullopt on any failure or after `limit`.
  std::optional<std::string> Post(int member, const std::string& path, const std::string& body,
                                  std::chrono::milliseconds limit) const;

 private:
  struct Member {
    std::string name;
    uint16_t client_port = 0;
    uint16_t peer_port = 0;
    uint16_t plain_port = 0;  // http on loopback, for Post; the client port unless tls
    std::string client_url;
    std::string data_dir;
    std::string log_path;
    pid_t pid = -1;
  };

  EtcdCluster() = default;
  bool Spawn(Member& member, bool first_start);
  /// Makes the CA and the certificates with openssl; what failed, or "".
  std::string MakeCertificates() const;
  /// member_id and leader as member i's /v3/maintenance/status gives them.
  std::optional<std::pair<std::string, std::string>> Status(int member,
                                                            std::chrono::milliseconds limit) const;
  std::optional<int> LeaderOnce() const;
  /// Post's request: the status and the body of any answer.
  std::optional<std::pair<int, std::string>> Request(int member, const std::string& path,
                                                     const std::string& body,
                                                     std::chrono::milliseconds limit) const;

  Options options_;
  std::string dir_;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace ddprun::etcdtest
