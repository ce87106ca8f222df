// What EtcdStore reads in etcd's JSON gateway answers (runner/io/etcd_gateway.h), without a
// network: each call's answer, errors that try another member or fail the call, answers of a
// shape etcd never sends, base64 and the endpoints' URLs.
#include "runner/io/etcd_gateway.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ddprun::io::etcd {
namespace {

TEST(EtcdGatewayTest, KeysAndValuesTravelInBase64) {
  EXPECT_EQ(Base64("/ddprun/job"), "L2RkcHJ1bi9qb2I=");
  for (const std::string& text :
       std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\n", 3)}) {
    EXPECT_EQ(Unbase64(Base64(text)), text);
  }
  EXPECT_EQ(Unbase64("abc"), std::nullopt);   // not a multiple of 4
  EXPECT_EQ(Unbase64("ab!d"), std::nullopt);  // not base64
  EXPECT_EQ(Decimal(-7), "-7");
}

TEST(EtcdGatewayTest, EachCallHasItsPath) {
  EXPECT_STREQ(PathOf(Kind::kGrant), "/v3/lease/grant");
  EXPECT_STREQ(PathOf(Kind::kKeepAlive), "/v3/lease/keepalive");
  EXPECT_STREQ(PathOf(Kind::kRevoke), "/v3/lease/revoke");
  EXPECT_STREQ(PathOf(Kind::kGet), "/v3/kv/range");
  EXPECT_STREQ(PathOf(Kind::kPutIf), "/v3/kv/txn");
}

TEST(EtcdGatewayTest, AnswersAreRead) {
  Outcome grant = Interpret(Kind::kGrant, 200, R"({"header":{"revision":"12"},"ID":"7587","TTL":"10"})");
  EXPECT_EQ(grant.type, Outcome::Type::kAnswer);
  EXPECT_EQ(grant.result.lease, 7587);
  EXPECT_EQ(grant.result.ttl, std::chrono::seconds(10));
  EXPECT_EQ(grant.result.revision, 12);

  // keepalive streams: its answer is wrapped in "result"; a lease that is gone has no TTL.
  Outcome kept = Interpret(Kind::kKeepAlive, 200, R"({"result":{"header":{"revision":"3"},"ID":"7587"}})");
  EXPECT_EQ(kept.type, Outcome::Type::kAnswer);
  EXPECT_EQ(kept.result.lease, 7587);
  EXPECT_EQ(kept.result.ttl, std::chrono::seconds(0));

  Outcome got = Interpret(Kind::kGet, 200,
                          R"({"header":{"revision":"9"},"kvs":[{"key":"a2V5","value":"dmFsdWU=",)"
                          R"("create_revision":"4","mod_revision":"8","lease":"7587"}]})");
  ASSERT_TRUE(got.result.entry);
  EXPECT_EQ(got.result.entry->value, "value");
  EXPECT_EQ(got.result.entry->create_revision, 4);
  EXPECT_EQ(got.result.entry->mod_revision, 8);
  EXPECT_EQ(got.result.entry->lease, 7587);
  EXPECT_FALSE(Interpret(Kind::kGet, 200, R"({"header":{"revision":"9"}})").result.entry);

  // A compare that failed brings the key's entry, from the txn's range.
  Outcome lost = Interpret(Kind::kPutIf, 200,
                           R"({"header":{"revision":"9"},"responses":[{"response_range":{"kvs":[)"
                           R"({"value":"b3RoZXI=","create_revision":"5"}]}}]})");
  EXPECT_EQ(lost.type, Outcome::Type::kAnswer);
  EXPECT_FALSE(lost.result.succeeded);
  ASSERT_TRUE(lost.result.entry);
  EXPECT_EQ(lost.result.entry->value, "other");
  EXPECT_TRUE(Interpret(Kind::kPutIf, 200, R"({"succeeded":true})").result.succeeded);
}

TEST(EtcdGatewayTest, ErrorsTryAnotherMemberFailOrReauthenticate) {
  Outcome unavailable = Interpret(Kind::kGet, 503, R"({"error":"etcdserver: no leader","code":14})");
  EXPECT_EQ(unavailable.type, Outcome::Type::kTryElsewhere);
  EXPECT_EQ(unavailable.error, "etcdserver: no leader (HTTP 503)");

  Outcome streamed = Interpret(Kind::kKeepAlive, 200,
                               R"({"error":{"grpc_code":14,"http_code":503,"message":"leader changed"}})");
  EXPECT_EQ(streamed.type, Outcome::Type::kTryElsewhere);
  EXPECT_EQ(streamed.error, "leader changed");

  Outcome token = Interpret(Kind::kGet, 401,
                            R"({"error":"invalid auth token","message":"invalid auth token","code":16})");
  EXPECT_EQ(token.type, Outcome::Type::kReauthenticate);

  Outcome denied = Interpret(Kind::kPutIf, 403, R"({"message":"permission denied","code":7,"error":"x"})");
  EXPECT_EQ(denied.type, Outcome::Type::kFail);
  EXPECT_EQ(denied.error, "permission denied (HTTP 403)");

  EXPECT_EQ(Interpret(Kind::kGet, 502, "").type, Outcome::Type::kTryElsewhere);  // a proxy's 5xx
  EXPECT_EQ(Interpret(Kind::kGet, 200, "<html>").error, "an answer that is not JSON");
  EXPECT_EQ(Interpret(Kind::kGrant, 200, R"({"TTL":"10"})").error, "granted no lease");
  // Revoking a lease that is gone already is what was wanted.
  EXPECT_EQ(Interpret(Kind::kRevoke, 404, R"({"error":"lease not found","code":5})").type,
            Outcome::Type::kAnswer);
}

TEST(EtcdGatewayTest, AnAnswerOfAShapeEtcdNeverSendsIsNotParsed) {
  EXPECT_EQ(ShapeProblem(R"({"kvs":[{"value":"[[[[[[[[[[[[[[[[[[[["}]})"), "");  // brackets inside a string
  const std::string deep(17, '[');
  EXPECT_EQ(ShapeProblem(deep), "an answer nested more than 16 deep, which etcd never sends");
  std::string wide = "[";
  for (int i = 0; i < 5000; ++i) wide += "0,";
  EXPECT_EQ(ShapeProblem(wide), "an answer of more than 4096 values, which etcd never sends");
  Outcome hostile = Interpret(Kind::kGet, 200, std::string(4 << 20, '['));
  EXPECT_EQ(hostile.type, Outcome::Type::kTryElsewhere);
  EXPECT_EQ(hostile.error, "an answer nested more than 16 deep, which etcd never sends");
}

TEST(EtcdGatewayTest, EndpointsAreSchemeHostAndPort) {
  auto plain = ParseUrl("http://10.0.0.1:2380");
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->tls);
  EXPECT_EQ(plain->host, "10.0.0.1");
  EXPECT_EQ(plain->port, "2380");
  auto v6 = ParseUrl("https://[fd00::1]/");
  ASSERT_TRUE(v6);
  EXPECT_TRUE(v6->tls);
  EXPECT_EQ(v6->host, "fd00::1");
  EXPECT_EQ(v6->port, "2379");
  EXPECT_EQ(ParseUrl("10.0.0.1:2379").error(),
            "etcd endpoint \"10.0.0.1:2379\" is not an http:// or https:// URL");
  EXPECT_EQ(ParseUrl("http://etcd-0:2379/v3").error(),
            "etcd endpoint \"http://etcd-0:2379/v3\" has a path; give scheme, host and port only");
  EXPECT_EQ(ParseUrl("http://[fd00::1:2379").error(), "etcd endpoint \"http://[fd00::1:2379\": no closing ]");
  EXPECT_EQ(ParseUrl("http://etcd-0:0").error(),
            "etcd endpoint \"http://etcd-0:0\" is not scheme://host:port");
}

}  // namespace
}  // namespace ddprun::io::etcd
