#pragma once
// Reading and replacing files in folders that others can write to: logs.dir and the run
// folders below it (workers write there, and on a shared logs.dir other users may too), and the
// folder of event logs that `ddprun report` reads. Whatever is planted in a file's place there
// can neither hang ddprun, nor make it read or write another file, nor take its memory:
//
// - every open starts from an open folder and follows no link (O_NOFOLLOW on each part of the
//   path), so `rank-3.error.json -> /etc/shadow` is refused, not read and broadcast;
// - no open blocks (O_NONBLOCK), so a FIFO in a file's place opens at once, and is then refused
//   because fstat says it is not a regular file (nor is a socket, a device or a folder);
// - every read has a bound, and a file over it is refused with its size, not read in part.
//
// Files that ddprun creates for writing are made with O_EXCL by log_files.h.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "base/result.h"
#include "base/unique_fd.h"

namespace ddprun::io {

/// Opens `relative` ("attempt-0/rank-3.error.json") below the open folder `dir_fd` for reading,
/// close-on-exec. `shown` names the file in messages (a path the user knows). nullopt: there is
/// no such file. Refused, in words that say what is in the file's place: a symbolic link on the
/// way, a FIFO, a socket, a device, a folder.
Result<std::optional<UniqueFd>> OpenRegularFile(int dir_fd, std::string_view relative,
                                                const std::string& shown);

/// The whole text of `relative` below `dir_fd`, opened as OpenRegularFile does, when it holds
/// at most `max_bytes`; a larger file is refused ("... is larger than 64 KiB"), none of it kept.
Result<std::optional<std::string>> ReadRegularFile(int dir_fd, std::string_view relative,
                                                   const std::string& shown, size_t max_bytes);

/// Writes `text` to "<name>.new" in the open folder `dir_fd`, created afresh (whatever was
/// planted under that name is removed, never written through), and renames it over `name`: a
/// reader sees the old text or the new, never half of either. `shown` names `dir_fd`.
Status ReplaceFile(int dir_fd, const std::string& shown, const std::string& name, std::string_view text);

}  // namespace ddprun::io
