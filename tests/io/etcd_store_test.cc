// The real EtcdStore (runner/io/etcd_store.h) on a real Asio loop against a real 3-member etcd
// cluster on 127.0.0.1: leases, gets and compare-and-put as the election uses them, failover
// when the member in use or the leader is killed, and the bounds when no member answers; and
// against a fake endpoint whose answers no etcd gives (huge, deeply nested), the memory they
// cost.

#include "runner/io/etcd_store.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

#include "tests/e2e/harness.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/support/require.h"

namespace ddprun::io {
namespace {

using etcdtest::EtcdCluster;
using host::StorePut;
using host::StoreResult;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

/// Every answer the store gives, by id; how many each id got.
class Answers final : public host::StoreEvents {
 public:
  void OnStoreResult(const StoreResult& result) override {
    ++count_[result.id];
    results_[result.id] = result;
  }
  bool Has(uint64_t id) const { return results_.count(id) != 0; }
  int Count(uint64_t id) const { return count_.count(id) ? count_.at(id) : 0; }
  const StoreResult& Get(uint64_t id) const { return results_.at(id); }
  size_t total() const { return results_.size(); }

 private:
  std::map<uint64_t, StoreResult> results_;
  std::map<uint64_t, int> count_;
};

/// Sockets this process holds now.
int OpenSockets() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  while (const dirent* entry = ::readdir(dir)) {
    char target[256] = {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
    if (n > 0 && std::string(target, static_cast<size_t>(n)).starts_with("socket:")) ++count;
  }
  ::closedir(dir);
  return count;
}

/// A store and the answers it gave (ids are per store).
struct Client {
  std::unique_ptr<EtcdStore> store;
  std::unique_ptr<Answers> answers = std::make_unique<Answers>();
  EtcdStore* operator->() const { return store.get(); }
};

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DDPRUN_REQUIRE_OR_SKIP("etcd", test::CommandExists("etcd"),
                           "etcd is not installed (Debian: etcd-server)");
    EtcdCluster::Options options;
    options.free_port = [] { return e2e::FreePort(); };
    options.tls = tls_;
    // The TLS cluster's certificates are made with openssl.
    DDPRUN_REQUIRE_OR_SKIP("etcd", !tls_ || test::CommandExists("openssl"), "openssl is not installed");
    std::string error;
    cluster_ = EtcdCluster::Start(options, &error);
    ASSERT_TRUE(cluster_) << error;
    if (!tls_) store_ = MakeStore(cluster_->ClientUrls());
  }

  Client MakeStore(std::vector<std::string> endpoints) {
    EtcdStore::Options options;
    options.endpoints = std::move(endpoints);
    return MakeStore(options);
  }

  Client MakeStore(const EtcdStore::Options& options) {
    auto store = EtcdStore::Create(io_, options);
    EXPECT_TRUE(store) << (store ? "" : store.error());
    Client client;
    if (!store) return client;
    client.store = std::move(*store);
    client.store->SetEvents(client.answers.get());
    return client;
  }

  /// Runs the loop one step, for at most `limit`.
  void RunOne(std::chrono::milliseconds limit) {
    if (io_.stopped()) io_.restart();  // it stops whenever it runs out of work
    io_.run_one_for(limit);
  }

  /// Runs the loop until `client`'s call `id` is answered or `limit` passes; the answer.
  StoreResult Await(const Client& client, uint64_t id, std::chrono::milliseconds limit = 10s) {
    const Answers& answers = *client.answers;
    const auto deadline = SteadyClock::now() + limit;
    while (!answers.Has(id) && SteadyClock::now() < deadline) RunOne(20ms);
    // Whatever is queued runs too, so that a second answer to the same id would show.
    if (io_.stopped()) io_.restart();
    io_.poll();
    EXPECT_TRUE(answers.Has(id)) << "call " << id << " was not answered within " << limit.count() << " ms";
    EXPECT_EQ(answers.Count(id), 1) << "call " << id << " was answered more than once";
    if (!answers.Has(id)) return StoreResult{id, "no answer", false, 0, {}, {}, 0};
    return answers.Get(id);
  }
  StoreResult Await(uint64_t id, std::chrono::milliseconds limit = 10s) { return Await(store_, id, limit); }

  StoreResult AwaitOk(const Client& client, uint64_t id) {
    StoreResult result = Await(client, id);
    EXPECT_EQ(result.error, "") << "call " << id;
    return result;
  }
  StoreResult AwaitOk(uint64_t id) { return AwaitOk(store_, id); }
  /// The value a Get found; a failed or empty Get is said, not dereferenced (under load a call
  /// can run out of its 3 s bound while a new etcd leader settles: a failure, not a crash).
  static std::string ValueOf(const StoreResult& result) {
    return result.entry ? result.entry->value : "(no entry: " + result.error + ")";
  }

  bool tls_ = false;  // the cluster's clients speak https
  boost::asio::io_context io_;
  std::unique_ptr<EtcdCluster> cluster_;
  Client store_;
};

TEST_F(EtcdStoreTest, GrantKeepAliveRevokeAndALeasedKeyGoesWithItsLease) {
  const StoreResult granted = AwaitOk(store_->Grant(5s));
  ASSERT_NE(granted.lease, 0);
  EXPECT_EQ(granted.ttl, 5s);
  EXPECT_GT(granted.revision, 0);

  const StoreResult renewed = AwaitOk(store_->KeepAlive(granted.lease));
  EXPECT_EQ(renewed.ttl, 5s);

  const StoreResult put =
      AwaitOk(store_->PutIf("/t/leased", 0, {StorePut{"/t/leased", "mine", granted.lease}}));
  ASSERT_TRUE(put.succeeded);
  const StoreResult got = AwaitOk(store_->Get("/t/leased"));
  ASSERT_TRUE(got.entry);
  EXPECT_EQ(got.entry->lease, granted.lease);
  EXPECT_EQ(got.entry->value, "mine");

  AwaitOk(store_->Revoke(granted.lease));
  const StoreResult after = AwaitOk(store_->KeepAlive(granted.lease));
  EXPECT_EQ(after.ttl, 0s) << "a revoked lease cannot be renewed";
  EXPECT_FALSE(AwaitOk(store_->Get("/t/leased")).entry) << "the key went with its lease";
  // Revoking a lease that is gone is no error: it is gone, as asked.
  AwaitOk(store_->Revoke(granted.lease));
}

TEST_F(EtcdStoreTest, AShortTtlIsRoundedUpToWholeSeconds) {
  const StoreResult granted = AwaitOk(store_->Grant(1500ms));
  EXPECT_NE(granted.lease, 0);
  EXPECT_GE(granted.ttl, 2s);
}

TEST_F(EtcdStoreTest, GetGivesAbsentAndPresentKeysWithTheirRevisions) {
  const StoreResult absent = AwaitOk(store_->Get("/t/nothing"));
  EXPECT_FALSE(absent.entry);
  EXPECT_GT(absent.revision, 0);

  // Values are bytes: newlines, quotes, NUL and bytes that are not UTF-8 come back as written.
  const std::string value =
      std::string("agent=1\nendpoint=\"x\"\n", 22) + std::string(1, '\0') + "\xff\xfe end";
  const StoreResult created = AwaitOk(store_->PutIf("/t/k", 0, {StorePut{"/t/k", value, 0}}));
  ASSERT_TRUE(created.succeeded);
  EXPECT_GT(created.revision, absent.revision);

  const StoreResult present = AwaitOk(store_->Get("/t/k"));
  ASSERT_TRUE(present.entry);
  EXPECT_EQ(present.entry->value, value);
  EXPECT_EQ(present.entry->create_revision, created.revision);
  EXPECT_EQ(present.entry->mod_revision, created.revision);
  EXPECT_EQ(present.entry->lease, 0);
  EXPECT_EQ(present.revision, created.revision);

  // An empty value is a value (the gateway leaves the field out).
  ASSERT_TRUE(AwaitOk(store_->PutIf("/t/empty", 0, {StorePut{"/t/empty", "", 0}})).succeeded);
  const StoreResult empty = AwaitOk(store_->Get("/t/empty"));
  ASSERT_TRUE(empty.entry);
  EXPECT_EQ(empty.entry->value, "");
}

TEST_F(EtcdStoreTest, PutIfComparesTheKeysCreateRevision) {
  const StoreResult first = AwaitOk(store_->PutIf("/t/role", 0, {StorePut{"/t/role", "a", 0}}));
  ASSERT_TRUE(first.succeeded);
  const int64_t role_revision = first.revision;

  // The key exists now: a second "create" fails, changes nothing and says who holds it.
  const StoreResult second = AwaitOk(store_->PutIf("/t/role", 0, {StorePut{"/t/role", "b", 0}}));
  EXPECT_FALSE(second.succeeded);
  ASSERT_TRUE(second.entry);
  EXPECT_EQ(second.entry->value, "a");
  EXPECT_EQ(second.entry->create_revision, role_revision);

  // Fenced writes, as the coordinator makes them: the right create revision succeeds and writes
  // every put; a wrong one writes nothing.
  const StoreResult fenced = AwaitOk(store_->PutIf(
      "/t/role", role_revision, {StorePut{"/t/state", "s1", 0}, StorePut{"/t/other", "o1", 0}}));
  EXPECT_TRUE(fenced.succeeded);
  EXPECT_EQ(ValueOf(AwaitOk(store_->Get("/t/state"))), "s1");
  EXPECT_EQ(ValueOf(AwaitOk(store_->Get("/t/other"))), "o1");
  const StoreResult stale =
      AwaitOk(store_->PutIf("/t/role", role_revision + 100, {StorePut{"/t/state", "s2", 0}}));
  EXPECT_FALSE(stale.succeeded);
  ASSERT_TRUE(stale.entry);
  EXPECT_EQ(stale.entry->create_revision, role_revision);
  EXPECT_EQ(ValueOf(AwaitOk(store_->Get("/t/state"))), "s1");

  // A fenced write against a role key that is gone fails with no entry.
  const StoreResult gone = AwaitOk(store_->PutIf("/t/no-role", 7, {StorePut{"/t/state", "s3", 0}}));
  EXPECT_FALSE(gone.succeeded);
  EXPECT_FALSE(gone.entry);
}

TEST_F(EtcdStoreTest, NoAnswerBeforeTheCallReturnsAndEachCallIsAnsweredOnce) {
  // Many calls at once: more than are in flight at a time, all answered, none twice.
  std::vector<uint64_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(store_->Get("/t/many/" + std::to_string(i)));
  EXPECT_EQ(store_.answers->total(), 0u) << "no answer until the loop runs";
  for (uint64_t id : ids) EXPECT_FALSE(AwaitOk(id).entry);
  EXPECT_EQ(store_.answers->total(), ids.size());
}

TEST_F(EtcdStoreTest, KeepAliveConnectionsAreReused) {
  AwaitOk(store_->Get("/t/warm"));
  const int sockets = OpenSockets();
  for (int i = 0; i < 30; ++i) AwaitOk(store_->Get("/t/warm"));
  EXPECT_EQ(OpenSockets(), sockets) << "sequential calls take the connection the first one left open";
}

TEST_F(EtcdStoreTest, ADestroyedStoreAnswersNothingAndItsHandlersTouchNothing) {
  for (int i = 0; i < 6; ++i) store_->Get("/t/x");
  for (int i = 0; i < 3; ++i) RunOne(1ms);  // some calls in flight
  store_.store.reset();
  // The handlers still queued run, finding the store gone (the loop ends when none is left).
  if (io_.stopped()) io_.restart();
  io_.run_for(1500ms);
  EXPECT_EQ(store_.answers->total(), 0u);
}

TEST_F(EtcdStoreTest, TheMemberInUseKilledCallsGoOnThroughAnother) {
  // A follower first: killing the leader costs an election too (the next test).
  const auto leader = cluster_->Leader(5s);
  ASSERT_TRUE(leader) << cluster_->Logs();
  const int member = (*leader + 1) % cluster_->size();
  std::vector<std::string> endpoints = {cluster_->ClientUrl(member)};
  for (int i = 0; i < cluster_->size(); ++i) {
    if (i != member) endpoints.push_back(cluster_->ClientUrl(i));
  }
  store_ = MakeStore(endpoints);
  AwaitOk(store_->PutIf("/t/f", 0, {StorePut{"/t/f", "v", 0}}));
  const std::string used = store_->PreferredEndpoint();
  ASSERT_EQ(used, cluster_->ClientUrl(member));
  cluster_->Kill(member);

  const auto start = SteadyClock::now();
  const StoreResult got = AwaitOk(store_->Get("/t/f"));
  const auto took = SteadyClock::now() - start;
  ASSERT_TRUE(got.entry);
  EXPECT_EQ(got.entry->value, "v");
  EXPECT_NE(store_->PreferredEndpoint(), used);
  EXPECT_LT(took, 500ms) << "a killed member on this host refuses at once";
  RecordProperty("failover_ms",
                 static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  // Later calls start at the member that answered.
  const std::string now_used = store_->PreferredEndpoint();
  for (int i = 0; i < 5; ++i) AwaitOk(store_->Get("/t/f"));
  EXPECT_EQ(store_->PreferredEndpoint(), now_used);

  // Back again, it serves again.
  ASSERT_TRUE(cluster_->Restart(member));
  ASSERT_TRUE(cluster_->WaitHealthy(20s)) << cluster_->Logs();
  Client only_restarted = MakeStore({used});
  const StoreResult again = AwaitOk(only_restarted, only_restarted->Get("/t/f"));
  ASSERT_TRUE(again.entry);
  EXPECT_EQ(again.entry->value, "v");
}

TEST_F(EtcdStoreTest, TheLeaderKilledCallsSucceedAfterTheElection) {
  const auto leader = cluster_->Leader(5s);
  ASSERT_TRUE(leader) << cluster_->Logs();
  AwaitOk(store_->Get("/t/before"));
  cluster_->Kill(*leader);

  // Writes need a leader: the first call waits out the election within its own bound.
  const auto start = SteadyClock::now();
  const StoreResult put = Await(store_->PutIf("/t/after", 0, {StorePut{"/t/after", "x", 0}}));
  const auto took = SteadyClock::now() - start;
  EXPECT_EQ(put.error, "");
  EXPECT_TRUE(put.succeeded);
  EXPECT_LT(took, 3500ms);
  RecordProperty("write_after_leader_kill_ms",
                 static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  const auto new_leader = cluster_->Leader(5s);
  ASSERT_TRUE(new_leader);
  EXPECT_NE(*new_leader, *leader);
  const StoreResult granted = AwaitOk(store_->Grant(3s));
  EXPECT_NE(granted.lease, 0);
  EXPECT_EQ(ValueOf(AwaitOk(store_->Get("/t/after"))), "x");
}

TEST_F(EtcdStoreTest, EveryEndpointDownEveryCallIsAnsweredWithAnErrorWithinTheBound) {
  AwaitOk(store_->Get("/t/warm"));  // keep-alive connections open: they must fail too
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Kill(i);

  const auto start = SteadyClock::now();
  std::vector<uint64_t> ids = {store_->Grant(5s), store_->KeepAlive(42), store_->Revoke(42),
                               store_->Get("/t/a"), store_->PutIf("/t/a", 0, {StorePut{"/t/a", "v", 0}})};
  for (int i = 0; i < 10; ++i) ids.push_back(store_->Get("/t/queued"));
  std::chrono::nanoseconds slowest{};
  for (uint64_t id : ids) {
    const StoreResult result = Await(id, 6s);
    slowest = std::max(slowest, SteadyClock::now() - start);
    EXPECT_THAT(result.error, StartsWith("no etcd endpoint answered within 3 s: "));
    for (const std::string& url : cluster_->ClientUrls()) {
      EXPECT_THAT(result.error, HasSubstr("etcd at " + url + ": connection refused"));
    }
  }
  // Refused connections fail fast; a call goes round the endpoints until its 3 s are up.
  EXPECT_GE(slowest, 2900ms);
  EXPECT_LT(slowest, 3300ms);
  RecordProperty("all_down_slowest_answer_ms",
                 static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(slowest).count()));
}

TEST_F(EtcdStoreTest, AClosedPortIsNamedInTheErrorAndSkippedForTheNextEndpoint) {
  const uint16_t closed = e2e::FreePort();
  const std::string closed_url = "http://127.0.0.1:" + std::to_string(closed);
  Client lone = MakeStore({closed_url});
  const StoreResult failed = Await(lone, lone->Get("/t/a"), 5s);
  EXPECT_EQ(failed.error,
            "no etcd endpoint answered within 3 s: etcd at " + closed_url + ": connection refused");

  Client with_good = MakeStore({closed_url, cluster_->ClientUrl(1)});
  const auto start = SteadyClock::now();
  EXPECT_FALSE(AwaitOk(with_good, with_good->Get("/t/a")).entry);
  EXPECT_LT(SteadyClock::now() - start, 500ms);
  EXPECT_EQ(with_good->PreferredEndpoint(), cluster_->ClientUrl(1));
}

TEST_F(EtcdStoreTest, AnEndpointThatNeverAnswersCostsOneAttemptBound) {
  // A socket that listens and never accepts: connections complete in the kernel, no answer comes.
  const uint16_t port = e2e::FreePort();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  const std::string silent = "http://127.0.0.1:" + std::to_string(port);

  Client store = MakeStore({silent, cluster_->ClientUrl(0)});
  const auto start = SteadyClock::now();
  EXPECT_FALSE(AwaitOk(store, store->Get("/t/a")).entry);
  const auto took = SteadyClock::now() - start;
  EXPECT_GE(took, 950ms);
  EXPECT_LT(took, 1500ms);
  EXPECT_EQ(store->PreferredEndpoint(), cluster_->ClientUrl(0));

  Client alone = MakeStore({silent});
  const StoreResult failed = Await(alone, alone->Get("/t/a"), 5s);
  EXPECT_EQ(failed.error,
            "no etcd endpoint answered within 3 s: etcd at " + silent + ": no answer within 1 s");
  ::close(fd);
}

TEST_F(EtcdStoreTest, AuthenticatesAtEachMemberWithAUserAndPassword) {
  DDPRUN_REQUIRE_OR_SKIP("etcd", test::CommandExists("etcdctl"),
                         "etcdctl is not installed (Debian: etcd-client)");
  const std::string etcdctl = "ETCDCTL_API=3 etcdctl --endpoints=" + cluster_->ClientUrl(0) + " ";
  ASSERT_EQ(std::system((etcdctl + "user add root:secret >/dev/null 2>&1").c_str()), 0);
  ASSERT_EQ(std::system((etcdctl + "auth enable >/dev/null 2>&1").c_str()), 0);

  EtcdStore::Options options;
  options.endpoints = cluster_->ClientUrls();
  options.user = "root";
  options.password = "secret";
  Client store = MakeStore(options);
  ASSERT_TRUE(AwaitOk(store, store->PutIf("/t/auth", 0, {StorePut{"/t/auth", "v", 0}})).succeeded);
  // A member's token is good at that member only (etcd's simple tokens): after a failover the
  // store authenticates again at the next one.
  const std::string first = store->PreferredEndpoint();
  cluster_->Kill(cluster_->MemberOf(first));
  const StoreResult got = AwaitOk(store, store->Get("/t/auth"));
  EXPECT_NE(store->PreferredEndpoint(), first);
  EXPECT_EQ(got.entry.value_or(host::StoreEntry{}).value, "v");

  // A member that restarted forgot its tokens (and closed the keep-alive connection): the
  // store opens a new connection, is told its token is invalid, and authenticates again there.
  const int member = cluster_->MemberOf(store->PreferredEndpoint());
  Client lone = MakeStore(EtcdStore::Options{{cluster_->ClientUrl(member)}, "", "", "", "root", "secret"});
  EXPECT_EQ(AwaitOk(lone, lone->Get("/t/auth")).entry.value_or(host::StoreEntry{}).value, "v");
  ASSERT_TRUE(cluster_->Restart(member));
  ASSERT_TRUE(cluster_->WaitHealthy(20s)) << cluster_->Logs();
  EXPECT_EQ(AwaitOk(lone, lone->Get("/t/auth")).entry.value_or(host::StoreEntry{}).value, "v");

  // A wrong password and no user are refusals, answered at once, not tried elsewhere.
  options.password = "wrong";
  Client wrong = MakeStore(options);
  const auto start = SteadyClock::now();
  const StoreResult refused = Await(wrong, wrong->Get("/t/auth"));
  EXPECT_LT(SteadyClock::now() - start, 1s);
  EXPECT_THAT(refused.error, AllOf(StartsWith("etcd at http://127.0.0.1:"),
                                   HasSubstr(": cannot authenticate as \"root\": etcdserver: authentication "
                                             "failed, invalid user ID or password (HTTP 400)")));
  Client anonymous = MakeStore(cluster_->ClientUrls());
  EXPECT_THAT(Await(anonymous, anonymous->Get("/t/auth")).error,
              AllOf(StartsWith("etcd at http://127.0.0.1:"),
                    HasSubstr(": etcdserver: user name is empty (HTTP 400)")));
}

class EtcdStoreTlsTest : public EtcdStoreTest {
 protected:
  EtcdStoreTlsTest() { tls_ = true; }
};

TEST_F(EtcdStoreTlsTest, HttpsWithTheClustersCaAndAClientCertificate) {
  EtcdStore::Options options;
  options.endpoints = cluster_->ClientUrls();
  options.ca_file = cluster_->ca_file();
  options.cert_file = cluster_->client_cert_file();
  options.key_file = cluster_->client_key_file();
  Client store = MakeStore(options);
  ASSERT_TRUE(AwaitOk(store, store->PutIf("/t/tls", 0, {StorePut{"/t/tls", "secret", 0}})).succeeded);
  const StoreResult got = AwaitOk(store, store->Get("/t/tls"));
  ASSERT_TRUE(got.entry);
  EXPECT_EQ(got.entry->value, "secret");
  EXPECT_NE(AwaitOk(store, store->Grant(3s)).lease, 0);

  // A failover goes through a new TLS connection to the next member.
  cluster_->Kill(cluster_->MemberOf(store->PreferredEndpoint()));
  EXPECT_EQ(AwaitOk(store, store->Get("/t/tls")).entry.value_or(host::StoreEntry{}).value, "secret");
}

TEST_F(EtcdStoreTlsTest, ACertificateThatDoesNotVerifyIsNamedInTheError) {
  const std::string url = cluster_->ClientUrl(0);
  EtcdStore::Options options;
  options.endpoints = {url};
  options.call_limit = 1s;
  options.attempt_limit = 500ms;
  // The system's CAs did not sign the test cluster's certificate.
  Client unknown_ca = MakeStore(options);
  const StoreResult refused = Await(unknown_ca, unknown_ca->Get("/t/a"), 5s);
  EXPECT_THAT(refused.error, StartsWith("no etcd endpoint answered within 1 s: etcd at " + url +
                                        ": TLS handshake failed (unable to get local issuer certificate): "));
  // etcd asks for a client certificate (--client-cert-auth): without one, no answer.
  options.ca_file = cluster_->ca_file();
  Client no_client_cert = MakeStore(options);
  const StoreResult rejected = Await(no_client_cert, no_client_cert->Get("/t/a"), 5s);
  EXPECT_THAT(rejected.error, StartsWith("no etcd endpoint answered within 1 s: etcd at " + url + ": "));
}

TEST(EtcdStoreCreateTest, RefusesWhatIsNotAnEndpointAndTlsFilesItCannotLoad) {
  boost::asio::io_context io;
  auto create = [&](std::vector<std::string> endpoints, std::string ca = "", std::string cert = "",
                    std::string key = "") {
    EtcdStore::Options options;
    options.endpoints = std::move(endpoints);
    options.ca_file = std::move(ca);
    options.cert_file = std::move(cert);
    options.key_file = std::move(key);
    auto store = EtcdStore::Create(io, options);
    return store ? std::string() : store.error();
  };
  EXPECT_EQ(create({}), "no etcd endpoints (rendezvous.endpoints)");
  EXPECT_EQ(create({"127.0.0.1:2379"}), "etcd endpoint \"127.0.0.1:2379\" is not an http:// or https:// URL");
  EXPECT_EQ(create({"http://127.0.0.1:99999"}),
            "etcd endpoint \"http://127.0.0.1:99999\" is not scheme://host:port");
  EXPECT_EQ(create({"http://127.0.0.1:2379/v3"}),
            "etcd endpoint \"http://127.0.0.1:2379/v3\" has a path; give scheme, host and port only");
  EXPECT_EQ(create({"http://127.0.0.1:2379", "http://[::1]:2379/", "http://etcd-0"}), "");
  EXPECT_THAT(create({"https://127.0.0.1:2379"}, "/nonexistent/ca.pem"),
              StartsWith("rendezvous.ca_file /nonexistent/ca.pem: "));
  EXPECT_EQ(create({"https://127.0.0.1:2379"}, "", "/nonexistent/cert.pem"),
            "rendezvous.cert_file and rendezvous.key_file go together: give both or neither");
  EXPECT_THAT(create({"https://127.0.0.1:2379"}, "", "/nonexistent/cert.pem", "/nonexistent/key.pem"),
              StartsWith("rendezvous.cert_file /nonexistent/cert.pem: "));
  // Plain http endpoints need no TLS files, and do not look at them.
  EXPECT_EQ(create({"http://127.0.0.1:2379"}, "/nonexistent/ca.pem"), "");
}

// ---- Answers that no etcd gives: bounded before they are parsed ---------------------------

/// A field of this process's /proc/self/status ("VmHWM") in KiB; -1 when unreadable.
long OwnStatusKiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

/// Answers one request on the connection `fd` with `body` (HTTP 200, JSON), then closes it.
void AnswerWith(int fd, const std::string& body) {
  char request[65536];
  (void)::recv(fd, request, sizeof request, 0);  // a small POST: one read holds it
  const std::string response =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = ::send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the store stopped reading: its bound
    sent += static_cast<size_t>(n);
  }
  ::close(fd);
}

struct ChildAnswer {
  long peak_growth_kib = -1;  // how much the child's peak memory grew while it asked
  std::string error;          // the store's answer to the call
};

/// A real EtcdStore in a child process (so that its peak memory is its own) asks a fake
/// endpoint for a key; every connection to the endpoint is answered with `body`.
ChildAnswer GetFromAFakeEndpoint(const std::string& body) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(e2e::FreePort());
  EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::listen(listener, 16), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  int report[2];
  EXPECT_EQ(::pipe2(report, O_CLOEXEC), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    ::close(listener);
    const long before = OwnStatusKiB("VmHWM");
    std::string error = "no answer";
    {
      boost::asio::io_context io;
      EtcdStore::Options options;
      options.endpoints = {url};
      // Generous bounds: on a loaded machine (and under ASan) one attempt at 1.8 MB took more
      // than 500 ms, and once more than 1.5 s, and the error was then that attempt's timeout
      // instead of the refusal.
      options.call_limit = 5s;
      options.attempt_limit = 4s;
      auto store = EtcdStore::Create(io, options);
      Answers answers;
      if (store) {
        (*store)->SetEvents(&answers);
        const uint64_t id = (*store)->Get("/t/a");
        const auto deadline = SteadyClock::now() + 30s;
        while (!answers.Has(id) && SteadyClock::now() < deadline) {
          if (io.stopped()) io.restart();
          io.run_one_for(20ms);
        }
        if (answers.Has(id)) error = answers.Get(id).error;
      }
    }
    const std::string text = std::to_string(OwnStatusKiB("VmHWM") - before) + "\n" + error;
    (void)!::write(report[1], text.data(), text.size());
    ::_exit(0);
  }
  ::close(report[1]);
  // Answer every connection until the child reports.
  std::string text;
  while (true) {
    pollfd fds[2] = {{listener, POLLIN, 0}, {report[0], POLLIN, 0}};
    if (::poll(fds, 2, 40'000) <= 0) break;
    if (fds[1].revents != 0) {
      char buffer[4096];
      ssize_t n = 0;
      while ((n = ::read(report[0], buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<size_t>(n));
      break;
    }
    if (const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC); fd >= 0) AnswerWith(fd, body);
  }
  ::close(report[0]);
  ::close(listener);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ChildAnswer answer;
  const size_t newline = text.find('\n');
  if (newline == std::string::npos) return answer;
  answer.peak_growth_kib = std::stol(text.substr(0, newline));
  answer.error = text.substr(newline + 1);
  return answer;
}

// Under AddressSanitizer freed memory sits in quarantine: the memory bounds are checked in the
// normal builds only.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMeasuresMemory = false;
#else
constexpr bool kMeasuresMemory = true;
#endif

// Hostile environments, part 2: an endpoint (a hostile host, or a proxy gone wrong) answers 4 MB
// of nested brackets, which a JSON parser turns into hundreds of MB. The store must refuse it
// before parsing, as an error that names the endpoint, and stay within a few MB.
TEST(EtcdStoreHostileTest, AHugeNestedAnswerIsAnErrorNamingTheEndpointAndCostsLittleMemory) {
  const ChildAnswer answer = GetFromAFakeEndpoint(std::string(2'000'000, '[') + std::string(2'000'000, ']'));
  EXPECT_THAT(answer.error,
              AllOf(StartsWith("no etcd endpoint answered within 5 s: etcd at http://127.0.0.1:"),
                    HasSubstr(": an answer over 2 MiB")));
  if (kMeasuresMemory) {
    EXPECT_LT(answer.peak_growth_kib, 16 * 1024) << "KiB";
  }
  RecordProperty("nested_4mb_peak_growth_kib", static_cast<int>(answer.peak_growth_kib));
}

TEST(EtcdStoreHostileTest, AnAnswerWithinTheSizeBoundButNestedDeepIsRefusedBeforeParsing) {
  const ChildAnswer answer =
      GetFromAFakeEndpoint("{\"kvs\":" + std::string(900'000, '[') + std::string(900'000, ']') + "}");
  EXPECT_THAT(answer.error,
              AllOf(StartsWith("no etcd endpoint answered within 5 s: etcd at http://127.0.0.1:"),
                    HasSubstr(": an answer nested more than 16 deep, which etcd never sends")));
  if (kMeasuresMemory) {
    EXPECT_LT(answer.peak_growth_kib, 16 * 1024) << "KiB";
  }
  RecordProperty("nested_1800kb_peak_growth_kib", static_cast<int>(answer.peak_growth_kib));
}

TEST(EtcdStoreHostileTest, AnAnswerOfTooManyValuesIsRefusedBeforeParsing) {
  std::string many = "{\"kvs\":[{}";
  while (many.size() < 1'800'000) many += ",{}";
  const ChildAnswer answer = GetFromAFakeEndpoint(many + "]}");
  EXPECT_THAT(answer.error,
              AllOf(StartsWith("no etcd endpoint answered within 5 s: etcd at http://127.0.0.1:"),
                    HasSubstr(": an answer of more than 4096 values, which etcd never sends")));
  if (kMeasuresMemory) {
    EXPECT_LT(answer.peak_growth_kib, 16 * 1024) << "KiB";
  }
  RecordProperty("many_values_peak_growth_kib", static_cast<int>(answer.peak_growth_kib));
}

}  // namespace
}  // namespace ddprun::io
