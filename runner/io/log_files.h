#pragma once
// Creating ddprun's files below logs.dir without following links and without writing over
// anything: every folder is opened from the one above it with O_NOFOLLOW, every file is
// created with O_EXCL. A link planted below logs.dir (by another user of a shared logs.dir,
// when agents run as root) therefore makes the open fail; it is never followed.

#include <string>

#include "base/result.h"
#include "base/unique_fd.h"

namespace ddprun::io {

/// Opens the folder `relative` ("a/b/c") below the open folder `dir_fd`, creating what is
/// missing (mode 0755 before umask). With `last_must_be_new`, the last folder must not exist
/// yet. `shown` is how `dir_fd` is named in messages. A failure says what and why, for the user.
Result<UniqueFd> OpenFolderBelow(int dir_fd, const std::string& shown, const std::string& relative,
                                 bool last_must_be_new);

/// Creates the file `relative` ("a/b/f.log") below `dir_fd` for writing (close-on-exec), making
/// its folders as OpenFolderBelow does. An existing file, or a link in its place, is an error.
Result<UniqueFd> CreateFileBelow(int dir_fd, const std::string& shown, const std::string& relative);

}  // namespace ddprun::io
