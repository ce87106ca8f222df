// The same program as beacon_program.c, compiled as C++ with ddprun's warnings: the header is
// valid C++.
#include "beacon_program.c"
