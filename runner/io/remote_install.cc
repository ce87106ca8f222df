#include "runner/io/remote_install.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <openssl/evp.h>

#include "schema/canonical.h"

namespace ddprun::io {
namespace fs = std::filesystem;
namespace {

/// Names a manifest line and a ustar header carry as they are: no escaping on either side.
bool PlainName(const std::string& name) {
  return !name.empty() && name.size() < 100 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || c == '+' || c == '/';
  });
}

/// One file's SHA-256 (lower-case hex) and size, read in pieces; its bytes appended to `keep`
/// when given (the tar stream).
struct Hashed {
  std::string sha256;
  uint64_t size = 0;
};
Result<Hashed> HashFile(const fs::path& path, std::string* keep) {
  std::ifstream in(path, std::ios::binary);
  const auto fail = [&] { return Fail(fmt::format("cannot read {}", path.string())); };
  if (!in) return fail();
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!context || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1) return fail();
  Hashed hashed;
  std::string piece(1 << 20, '\0');
  while (in) {
    in.read(piece.data(), static_cast<std::streamsize>(piece.size()));
    const auto got = static_cast<size_t>(in.gcount());
    if (got == 0) break;
    EVP_DigestUpdate(context.get(), piece.data(), got);
    if (keep) keep->append(piece.data(), got);
    hashed.size += got;
  }
  if (in.bad()) return fail();
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(context.get(), digest, &length) != 1) return fail();
  for (unsigned i = 0; i < length; ++i) hashed.sha256 += fmt::format("{:02x}", digest[i]);
  return hashed;
}

/// One ustar header block (POSIX.1-1988): octal fields, the checksum over the block with its
/// own field as spaces.
std::string TarHeader(const std::string& name, char type, unsigned mode, uint64_t size, int64_t mtime) {
  std::string block(512, '\0');
  auto put = [&](size_t at, const std::string& text) { block.replace(at, text.size(), text); };
  put(0, name);                                                   // name[100]
  put(100, fmt::format("{:07o}", mode));                          // mode[8]
  put(108, "0000000");                                            // uid[8]
  put(116, "0000000");                                            // gid[8]
  put(124, fmt::format("{:011o}", size));                         // size[12]
  put(136, fmt::format("{:011o}", std::max<int64_t>(mtime, 0)));  // mtime[12]
  put(148, "        ");                                           // chksum[8], as spaces
  block[156] = type;
  put(257, std::string("ustar\0", 6));
  put(263, "00");
  put(265, "root");  // uname[32]
  put(297, "root");  // gname[32]
  unsigned sum = 0;
  for (const char c : block) sum += static_cast<unsigned char>(c);
  put(148, fmt::format("{:06o}", sum) + std::string("\0 ", 2));
  return block;
}

}  // namespace

Result<LocalCopy> ReadLocalCopy(const fs::path& exe, const std::string& version, bool with_tar) {
  const fs::path share = exe.parent_path() / ".." / "share" / "ddprun";
  std::error_code ec;
  if (!fs::is_directory(share, ec)) {
    return Fail(
        fmt::format("this ddprun has no share/ddprun beside it (looked for {}): install it from the "
                    "tarball or the .deb, or run it from its build folder",
                    share.lexically_normal().string()));
  }
  std::map<std::string, fs::path> files;  // name in the copy -> where it is here; sorted
  files["bin/ddprun"] = exe;
  std::set<std::string> dirs = {"bin", "share", "share/ddprun"};
  for (auto it = fs::recursive_directory_iterator(share, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string name = "share/ddprun/" + fs::relative(it->path(), share).generic_string();
    if (it->path().filename() == "__pycache__") {
      it.disable_recursion_pending();
      continue;
    }
    if (!PlainName(name))
      return Fail(fmt::format("{}: a file name the copy cannot carry", it->path().string()));
    if (it->is_directory(ec)) {
      dirs.insert(name);
    } else if (it->is_regular_file(ec) && it->path().extension() != ".pyc") {
      files[name] = it->path();
    }
  }
  if (ec) return Fail(fmt::format("cannot list {}: {}", share.string(), ec.message()));

  LocalCopy copy;
  std::string tar;
  if (with_tar) {
    for (const std::string& dir : dirs) tar += TarHeader(dir + "/", '5', 0755, 0, 0);
  }
  for (const auto& [name, path] : files) {
    std::string bytes;
    auto hashed = HashFile(path, with_tar ? &bytes : nullptr);
    if (!hashed) return Fail(hashed.error());
    copy.manifest += hashed->sha256 + "  ./" + name + "\n";
    copy.bytes += hashed->size;
    ++copy.files;
    if (!with_tar) continue;
    struct stat st {};
    const int64_t mtime = ::stat(path.c_str(), &st) == 0 ? st.st_mtime : 0;
    tar += TarHeader(name, '0', name == "bin/ddprun" ? 0555 : 0444, bytes.size(), mtime);
    tar += bytes;
    tar.append((512 - bytes.size() % 512) % 512, '\0');
  }
  copy.manifest_sum = Sha256Hex(copy.manifest);
  copy.id = version + "-" + copy.manifest_sum.substr(0, 12);
  if (with_tar) {
    tar.append(1024, '\0');
    copy.tar = std::make_shared<const std::string>(std::move(tar));
  }
  return copy;
}

std::string CopyCheckShell(const std::string& id, const std::string& manifest_sum) {
  // find's -perm /022: writable by the group or others. The manifest skips __pycache__, which
  // Python may write as the copy's owner; the owner and mode checks cover it too.
  return fmt::format(
      "b=\"$HOME/.ddprun\"; c=\"$b/{0}\"; "
      "ddprun_copy_ok() {{ [ -d \"$b\" ] && [ ! -L \"$b\" ] && [ -d \"$1\" ] && [ ! -L \"$1\" ] && "
      "[ -x \"$1/bin/ddprun\" ] && "
      "[ -z \"$(find \"$b\" -maxdepth 0 \\( ! -user \"$(id -u)\" -o -perm /022 \\) -print 2>&1)\" ] && "
      "[ -z \"$(find \"$1\" \\( -type l -o ! -user \"$(id -u)\" -o -perm /022 \\) -print 2>&1)\" ] && "
      "[ \"$(cd \"$1\" && find . -name __pycache__ -prune -o -type f -print | LC_ALL=C sort | "
      "xargs -r -d '\\n' sha256sum -- | sha256sum)\" = \"{1}  -\" ]; }}; ",
      id, manifest_sum);
}

std::string InstallLine(const LocalCopy& copy) {
  std::string line = "umask 022; " + CopyCheckShell(copy.id, copy.manifest_sum);
  line += fmt::format(
      "say() {{ echo \"ddprun-install: $*\"; }}; fail() {{ say \"error $*\"; exit 1; }}; "
      "if ddprun_copy_ok \"$c\"; then say \"present $c\"; exit 0; fi; "
      "mkdir -p \"$b\" || fail \"cannot create $b\"; "
      "[ ! -L \"$b\" ] || fail \"$b is a symbolic link; ddprun installs only into a folder of its own\"; "
      "[ -z \"$(find \"$b\" -maxdepth 0 ! -user \"$(id -u)\" -print)\" ] || fail \"$b belongs to another "
      "user\"; "
      "[ -z \"$(find \"$b\" -maxdepth 0 -perm /022 -print)\" ] || "
      "fail \"$b can be written by other users (its group or everyone): chmod go-w $b\"; "
      "t=$(mktemp -d \"$b/.install-{0}.XXXXXX\") || fail \"cannot create a folder in $b\"; "
      "w=$(tar -x -f - -C \"$t\" --no-same-owner 2>&1) || "
      "{{ rm -rf \"$t\"; fail \"tar could not unpack the copy: $(echo \"$w\" | tail -n 1)\"; }}; "
      "ddprun_copy_ok \"$t\" || {{ rm -rf \"$t\"; fail \"the copy arrived changed: its files do not match "
      "what "
      "was sent\"; }}; "
      "v=$(\"$t/bin/ddprun\" --version 2>&1) || "
      "{{ rm -rf \"$t\"; fail \"the copy does not run on this host: $(echo \"$v\" | tail -n 1)\"; }}; "
      // Another `up` (a shared home) may have put it in place meanwhile: only a folder that
      // still does not match is moved aside; the rename below never replaces a folder.
      "m=; if [ -e \"$c\" ] || [ -L \"$c\" ]; then "
      "if ddprun_copy_ok \"$c\"; then rm -rf \"$t\"; say \"present $c\"; exit 0; fi; "
      "m=\"$b/.replaced-{0}.$(date +%Y%m%d-%H%M%S).$$\"; "
      "mv \"$c\" \"$m\" || {{ rm -rf \"$t\"; fail \"cannot move aside $c, which does not match this "
      "ddprun\"; }}; "
      "fi; "
      "if ! mv -T \"$t\" \"$c\" 2>/dev/null; then rm -rf \"$t\"; "
      "if ddprun_copy_ok \"$c\"; then say \"present $c\"; exit 0; fi; fail \"cannot put the copy at $c\"; "
      "fi; "
      "say \"installed $c\"; [ -z \"$m\" ] || say \"moved-aside $m\"",
      copy.id);
  return line;
}

InstallOutcome ReadInstall(int exit_status, const std::string& out, const std::string& err) {
  InstallOutcome outcome;
  std::istringstream lines(out);
  bool answered = false;
  for (std::string line; std::getline(lines, line);) {
    constexpr std::string_view kSaid = "ddprun-install: ";
    if (!line.starts_with(kSaid)) continue;
    answered = true;
    const std::string said = line.substr(kSaid.size());
    const size_t space = said.find(' ');
    const std::string word = said.substr(0, space);
    const std::string rest = space == std::string::npos ? "" : said.substr(space + 1);
    if (word == "present" || word == "installed") {
      outcome.ok = true;
      outcome.installed = word == "installed";
      outcome.path = rest;
    } else if (word == "moved-aside") {
      outcome.moved_aside = rest;
    } else if (word == "error") {
      outcome.ok = false;
      outcome.what = rest;
    }
  }
  if (outcome.ok && exit_status != 0) {
    outcome.ok = false;
    outcome.what = fmt::format("the install ended with exit {}", exit_status);
  }
  if (!answered) {
    std::string said = err;
    while (!said.empty() && said.back() == '\n') said.pop_back();
    if (const size_t nl = said.find_last_of('\n'); nl != std::string::npos) said = said.substr(nl + 1);
    outcome.what = exit_status == -1 ? std::string("no answer before the deadline")
                                     : fmt::format("no answer from the host (exit {}){}{}", exit_status,
                                                   said.empty() ? "" : ": ", said);
  }
  return outcome;
}

}  // namespace ddprun::io
