#include "tests/etcd/etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ddprun::etcdtest {

namespace {

using Clock = std::chrono::steady_clock;

void Pause(std::chrono::milliseconds ms) {
  timespec ts{static_cast<time_t>(ms.count() / 1000), static_cast<long>(ms.count() % 1000) * 1'000'000};
  ::nanosleep(&ts, nullptr);
}

/// Polls `predicate` every 50 ms until it holds or `limit` passes.
template <typename Predicate>
bool Poll(Predicate predicate, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (predicate()) return true;
    Pause(std::chrono::milliseconds(50));
  }
  return predicate();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::unique_ptr<EtcdCluster> EtcdCluster::Start(Options options, std::string* error) {
  std::unique_ptr<EtcdCluster> cluster(new EtcdCluster());
  cluster->options_ = std::move(options);
  std::string templ = (std::filesystem::temp_directory_path() / "ddprun-etcd-XXXXXX").string();
  if (!::mkdtemp(templ.data())) {
    if (error) *error = "mkdtemp failed";
    return nullptr;
  }
  cluster->dir_ = templ;
  if (cluster->options_.tls) {
    if (const std::string problem = cluster->MakeCertificates(); !problem.empty()) {
      if (error) *error = problem;
      return nullptr;
    }
  }
  for (int i = 0; i < cluster->options_.members; ++i) {
    Member m;
    m.name = "m" + std::to_string(i);
    m.client_port = cluster->options_.free_port();
    m.peer_port = cluster->options_.free_port();
    m.plain_port = cluster->options_.tls ? cluster->options_.free_port() : m.client_port;
    m.client_url = std::string(cluster->options_.tls ? "https" : "http") + "://" + cluster->options_.host +
                   ":" + std::to_string(m.client_port);
    m.data_dir = cluster->dir_ + "/" + m.name;
    m.log_path = cluster->dir_ + "/" + m.name + ".log";
    if (!cluster->initial_cluster_.empty()) cluster->initial_cluster_ += ",";
    cluster->initial_cluster_ +=
        m.name + "=http://" + cluster->options_.host + ":" + std::to_string(m.peer_port);
    cluster->members_.push_back(std::move(m));
  }
  for (Member& m : cluster->members_) {
    if (!cluster->Spawn(m, true)) {
      if (error)
        *error = "cannot start " + cluster->options_.etcd + " for " + m.name + "\n" + cluster->Logs();
      return nullptr;
    }
  }
  if (!cluster->WaitHealthy(cluster->options_.start_limit)) {
    if (error) *error = "the etcd cluster did not become healthy\n" + cluster->Logs();
    return nullptr;
  }
  return cluster;
}

std::string EtcdCluster::MakeCertificates() const {
  // EC keys: quick to make. Certificates for a day; the server's for 127.0.0.1 by its IP.
  const std::string d = dir_;
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  // The server's certificate is a client's too: etcd's JSON gateway dials the member's own gRPC
  // port with it, and --client-cert-auth checks it there.
  std::ofstream(d + "/server.ext") << "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n";
  std::ofstream(d + "/client.ext") << "extendedKeyUsage=clientAuth\n";
  const std::vector<std::string> commands = {
      "openssl req -x509 " + key + " -keyout " + d + "/ca.key -out " + d +
          "/ca.pem -days 1 -subj /CN=ddprun-test-ca",
      "openssl req " + key + " -keyout " + d + "/server.key -out " + d + "/server.csr -subj /CN=127.0.0.1",
      "openssl x509 -req -in " + d + "/server.csr -CA " + d + "/ca.pem -CAkey " + d +
          "/ca.key -CAcreateserial -out " + d + "/server.pem -days 1 -extfile " + d + "/server.ext",
      "openssl req " + key + " -keyout " + d + "/client.key -out " + d +
          "/client.csr -subj /CN=ddprun-client",
      "openssl x509 -req -in " + d + "/client.csr -CA " + d + "/ca.pem -CAkey " + d +
          "/ca.key -CAcreateserial -out " + d + "/client.pem -days 1 -extfile " + d + "/client.ext",
  };
  for (const std::string& command : commands) {
    if (std::system((command + " >>" + d + "/openssl.log 2>&1").c_str()) != 0) {
      return "cannot make test certificates: " + command + "\n" + ReadFile(d + "/openssl.log");
    }
  }
  return "";
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i) Kill(i);
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

bool EtcdCluster::Spawn(Member& m, bool first_start) {
  const std::string ms_heartbeat = std::to_string(options_.heartbeat.count());
  const std::string ms_election = std::to_string(options_.election.count());
  const std::string peer_url = "http://" + options_.host + ":" + std::to_string(m.peer_port);
  std::vector<std::string> args = {
      options_.etcd,
      "--name",
      m.name,
      "--data-dir",
      m.data_dir,
      "--listen-client-urls",
      m.client_url + (options_.tls ? ",http://" + options_.host + ":" + std::to_string(m.plain_port) : ""),
      "--advertise-client-urls",
      m.client_url,
      "--listen-peer-urls",
      peer_url,
      "--initial-advertise-peer-urls",
      peer_url,
      "--initial-cluster",
      initial_cluster_,
      "--initial-cluster-state",
      first_start ? "new" : "existing",
      "--initial-cluster-token",
      std::filesystem::path(dir_).filename().string(),  // one per cluster
      "--heartbeat-interval",
      ms_heartbeat,
      "--election-timeout",
      ms_election,
      "--logger",
      "zap",
      "--log-outputs",
      "stderr",
  };
  if (options_.tls) {
    const std::vector<std::string> tls_args = {"--cert-file",        dir_ + "/server.pem", "--key-file",
                                               dir_ + "/server.key", "--trusted-ca-file",  ca_file(),
                                               "--client-cert-auth"};
    args.insert(args.end(), tls_args.begin(), tls_args.end());
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    // The member goes with the test process, even one that crashes.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int log = ::open(m.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int null = ::open("/dev/null", O_RDONLY);
    if (log < 0 || null < 0) ::_exit(127);
    ::dup2(null, 0);
    ::dup2(log, 1);
    ::dup2(log, 2);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  m.pid = pid;
  return true;
}

const std::string& EtcdCluster::ClientUrl(int member) const {
  return members_.at(static_cast<size_t>(member)).client_url;
}

std::vector<std::string> EtcdCluster::ClientUrls() const {
  std::vector<std::string> urls;
  for (const Member& m : members_) urls.push_back(m.client_url);
  return urls;
}

int EtcdCluster::MemberOf(const std::string& url) const {
  for (int i = 0; i < size(); ++i) {
    if (ClientUrl(i) == url) return i;
  }
  return -1;
}

pid_t EtcdCluster::pid(int member) const { return members_.at(static_cast<size_t>(member)).pid; }

bool EtcdCluster::Running(int member) const {
  const pid_t p = pid(member);
  if (p <= 0) return false;
  // Reaped here only through Kill; a member that exited on its own is a zombie until then.
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(p), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return info.si_pid == 0;
}

void EtcdCluster::Kill(int member) {
  Member& m = members_.at(static_cast<size_t>(member));
  if (m.pid <= 0) return;
  ::kill(m.pid, SIGKILL);
  int status = 0;
  ::waitpid(m.pid, &status, 0);
  m.pid = -1;
}

bool EtcdCluster::Restart(int member) {
  Kill(member);
  return Spawn(members_.at(static_cast<size_t>(member)), false);
}

std::string EtcdCluster::Log(int member) const {
  return ReadFile(members_.at(static_cast<size_t>(member)).log_path);
}

std::string EtcdCluster::Logs() const {
  std::string text;
  for (int i = 0; i < size(); ++i) {
    const std::string log = Log(i);
    // The end says why a member is down; the start is the same for every member.
    text += "---- " + members_[static_cast<size_t>(i)].name + " ----\n" +
            (log.size() > 4000 ? "...\n" + log.substr(log.size() - 4000) : log) + "\n";
  }
  return text;
}

std::optional<std::string> EtcdCluster::Post(int member, const std::string& path, const std::string& body,
                                             std::chrono::milliseconds limit) const {
  auto answer = Request(member, path, body, limit);
  if (!answer || answer->first != 200) return std::nullopt;
  return answer->second;
}

std::optional<std::pair<int, std::string>> EtcdCluster::Request(int member, const std::string& path,
                                                                const std::string& body,
                                                                std::chrono::milliseconds limit) const {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  timeval tv{static_cast<time_t>(limit.count() / 1000),
             static_cast<suseconds_t>(limit.count() % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (::inet_pton(AF_INET, options_.host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return std::nullopt;
  }
  addr.sin_port = htons(members_.at(static_cast<size_t>(member)).plain_port);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request =
        "POST " + path +
        " HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n" + body;
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      const auto deadline = Clock::now() + limit;
      char buf[4096];
      while (Clock::now() < deadline && answer.size() < (1u << 20)) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        answer.append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  const size_t head_end = answer.find("\r\n\r\n");
  if (head_end == std::string::npos) return std::nullopt;
  if (answer.compare(0, 5, "HTTP/") != 0 || answer.size() < 12) return std::nullopt;
  return std::make_pair(std::atoi(answer.substr(9, 3).c_str()), answer.substr(head_end + 4));
}

std::optional<std::pair<std::string, std::string>> EtcdCluster::Status(
    int member, std::chrono::milliseconds limit) const {
  const auto body = Post(member, "/v3/maintenance/status", "{}", limit);
  if (!body) return std::nullopt;
  const auto json = nlohmann::json::parse(*body, nullptr, false);
  if (!json.is_object() || !json.contains("header")) return std::nullopt;
  const std::string id = json["header"].value("member_id", "");
  const std::string leader = json.value("leader", "");
  if (id.empty()) return std::nullopt;
  return std::make_pair(id, leader);
}

std::optional<int> EtcdCluster::LeaderOnce() const {
  std::optional<std::string> leader_id;
  std::optional<int> leader;
  for (int i = 0; i < size(); ++i) {
    if (pid(i) <= 0) continue;
    const auto status = Status(i, std::chrono::milliseconds(500));
    if (!status || status->second.empty() || status->second == "0") return std::nullopt;
    if (leader_id && *leader_id != status->second) return std::nullopt;  // not agreed yet
    leader_id = status->second;
    if (status->first == status->second) leader = i;
  }
  return leader;  // nullopt when the leader they name is not running
}

std::optional<int> EtcdCluster::Leader(std::chrono::milliseconds limit) const {
  std::optional<int> leader;
  Poll([&] { return (leader = LeaderOnce()).has_value(); }, limit);
  return leader;
}

bool EtcdCluster::WaitHealthy(std::chrono::milliseconds limit) const {
  return Poll(
      [&] {
        if (!LeaderOnce()) return false;
        // A linearizable read through every running member: each reaches the leader.
        for (int i = 0; i < size(); ++i) {
          if (pid(i) <= 0) continue;
          // With authentication on (a test enabled it), the refusal is the answer: the
          // members' agreement on the leader must do.
          const auto read =
              Request(i, "/v3/kv/range", R"({"key":"aGVhbHRo"})", std::chrono::milliseconds(500));
          if (!read) return false;
          if (read->first != 200 && read->second.find("user name is empty") == std::string::npos)
            return false;
        }
        return true;
      },
      limit);
}

}  // namespace ddprun::etcdtest
