#include "runner/core/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fmt/format.h>

#include "base/hex.h"

namespace ddprun::core {
namespace {

std::string Hex(const unsigned char* data, unsigned int size) {
  return HexEncode(std::string_view(reinterpret_cast<const char*>(data), size));
}

}  // namespace

std::string HmacSha256Hex(std::string_view key, std::string_view message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &size);
  return Hex(digest, size);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr);
  return Hex(digest, size);
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string JoinProof(std::string_view secret, std::string_view nonce, int node_rank,
                      std::string_view fingerprint) {
  return HmacSha256Hex(secret, fmt::format("ddprun-join-v1\n{}\n{}\n{}", nonce, node_rank, fingerprint));
}

std::string CoordinatorProof(std::string_view secret, std::string_view agent_nonce,
                             std::string_view coordinator_nonce) {
  return HmacSha256Hex(secret, fmt::format("ddprun-coordinator-v1\n{}\n{}", agent_nonce, coordinator_nonce));
}

}  // namespace ddprun::core
