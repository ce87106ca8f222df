// Boost.Process v2 compiled once: its header-only mode in Boost 1.81 does not link
// (see shared/reference/deps.md).
#include <boost/process/v2/src.hpp>
