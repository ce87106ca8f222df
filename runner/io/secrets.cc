#include "runner/io/secrets.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include <sys/stat.h>

#include <fmt/format.h>

namespace ddprun::io {

Result<SharedSecret> ReadSharedSecret() {
  if (const char* value = std::getenv("DDPRUN_SECRET"); value && *value) {
    return SharedSecret{std::string(value), ""};
  }
  const char* path = std::getenv("DDPRUN_SECRET_FILE");
  if (!path || !*path) return SharedSecret{};
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(fmt::format("cannot read DDPRUN_SECRET_FILE {}: {}", path, std::strerror(errno)));
  SharedSecret shared;
  shared.secret.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  while (!shared.secret.empty() && (shared.secret.back() == '\n' || shared.secret.back() == '\r')) {
    shared.secret.pop_back();
  }
  if (shared.secret.empty()) return Fail(fmt::format("DDPRUN_SECRET_FILE {} is empty", path));
  struct stat st {};
  if (::stat(path, &st) == 0 && (st.st_mode & 077) != 0) {
    shared.warning = fmt::format("DDPRUN_SECRET_FILE {} is readable by other users (chmod 600 it)", path);
  }
  return shared;
}

void RemoveSharedSecret(std::map<std::string, std::string>& env) {
  env.erase("DDPRUN_SECRET");
  env.erase("DDPRUN_SECRET_FILE");
}

}  // namespace ddprun::io
