#pragma once
// The join handshake's cryptography: pure functions over OpenSSL (no randomness here; the
// coordinator's nonces come from a seed its driver supplies).

#include <string>
#include <string_view>

namespace ddprun::core {

/// Lower-case hex HMAC-SHA-256 of `message` under `key`.
std::string HmacSha256Hex(std::string_view key, std::string_view message);

/// Lower-case hex SHA-256.
std::string Sha256Hex(std::string_view data);

/// Compares in time independent of where the strings differ.
bool ConstantTimeEqual(std::string_view a, std::string_view b);

/// What a joining agent proves: it knows the secret, for this nonce, node and job.
std::string JoinProof(std::string_view secret, std::string_view nonce, int node_rank,
                      std::string_view fingerprint);

/// What the coordinator proves before an agent sends it anything about the job: it knows the
/// secret, for the agent's nonce and its own. Domain-separated from JoinProof, so neither side's
/// proof can be replayed as the other's.
std::string CoordinatorProof(std::string_view secret, std::string_view agent_nonce,
                             std::string_view coordinator_nonce);

}  // namespace ddprun::core
