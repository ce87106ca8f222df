#include "runner/io/worker_module.h"

#include <filesystem>
#include <string_view>
#include <system_error>

namespace ddprun::io {

namespace fs = std::filesystem;

std::optional<std::string> DdprunPythonDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return std::nullopt;
  return DdprunPythonDirFor(exe.string());
}

std::optional<std::string> DdprunPythonDirFor(const std::string& exe_path) {
  const fs::path dir = fs::path(exe_path).parent_path() / ".." / "share" / "ddprun" / "python";
  std::error_code ec;
  if (!fs::is_regular_file(dir / "ddprun" / "__init__.py", ec)) return std::nullopt;
  const fs::path canonical = fs::canonical(dir, ec);
  if (ec) return std::nullopt;
  return canonical.string();
}

std::optional<std::string> DdprunWarmTemplate() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return std::nullopt;
  return DdprunWarmTemplateFor(exe.string());
}

std::optional<std::string> DdprunWarmTemplateFor(const std::string& exe_path) {
  const fs::path script =
      fs::path(exe_path).parent_path() / ".." / "share" / "ddprun" / "warm" / "template.py";
  std::error_code ec;
  if (!fs::is_regular_file(script, ec)) return std::nullopt;
  const fs::path canonical = fs::canonical(script, ec);
  if (ec) return std::nullopt;
  return canonical.string();
}

}  // namespace ddprun::io
