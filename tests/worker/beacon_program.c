/* Sends beacons through worker/c/ddprun_progress.h as test_c_header.py expects: compiled as C
 * (beacon_from_c) and as C++ (beacon_from_cxx, through beacon_program.cc). */
#if !defined(__cplusplus) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* strict C99 shows POSIX (sockets, clock_gettime) only on request */
#endif

#include "ddprun_progress.h"

#include <time.h>

int main(void) {
  struct timespec pause;
  pause.tv_sec = 0;
  pause.tv_nsec = 150000000L;
  ddprun_progress(-1); /* not a step: nothing */
  ddprun_progress(7);
  ddprun_progress(8); /* within 0.1 s of the last: throttled */
  nanosleep(&pause, NULL);
  ddprun_progress(9);
  return 0;
}
