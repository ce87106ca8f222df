/* ddprun progress beacons for C and C++ training programs (header only, POSIX).
 *
 *     #include "ddprun_progress.h"
 *     ...
 *     ddprun_progress(step);   // after each training step
 *
 * Under ddprun, a call sends one small UDP datagram to the local ddprun agent, at most one every
 * 0.1 s (the next one that goes out carries the newest step). Without ddprun's environment it does
 * nothing. It never blocks and never fails the program: a beacon that cannot be sent is dropped.
 * The environment is read on the first call. Call it from one thread (the training loop); each
 * translation unit that includes this header keeps its own state. Beacons say busy time unknown
 * (-1) and register no stack dump (stack signal 0). The datagram format is in worker/README.md. */
#ifndef DDPRUN_PROGRESS_H
#define DDPRUN_PROGRESS_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
#define DDPRUN_PROGRESS_CAST_(type, value) static_cast<type>(value)
#else
#define DDPRUN_PROGRESS_CAST_(type, value) ((type)(value))
#endif

/* Parses a whole string of 1 to `max_digits` decimal digits; returns -1 when it is not one. */
static inline long ddprun_progress_parse_digits_(const char* text, int max_digits) {
  long value = 0;
  int digits = 0;
  if (text == NULL || *text == '\0') return -1;
  for (; *text != '\0'; ++text, ++digits) {
    if (*text < '0' || *text > '9' || digits >= max_digits) return -1;
    value = value * 10 + (*text - '0');
  }
  return value;
}

/* Sends `step` (>= 0; a negative step does nothing) as a progress beacon to the ddprun agent. */
static inline void ddprun_progress(long long step) {
  /* 0: environment not read yet, 1: sending, -1: disabled (no or malformed environment). */
  static int state = 0;
  static int fd = -1;
  static pid_t pid = 0;
  static char prefix[128];
  static int have_sent = 0;
  static struct timespec last_sent;
  struct timespec now;
  char datagram[256];
  int length;

  if (state == 0) {
    const char* address = getenv("DDPRUN_PROGRESS_ADDR");
    const char* token = getenv("DDPRUN_PROGRESS_TOKEN");
    const char* colon = address != NULL ? strrchr(address, ':') : NULL;
    long round = ddprun_progress_parse_digits_(getenv("TORCHELASTIC_RESTART_COUNT"), 9);
    long local_rank = ddprun_progress_parse_digits_(getenv("LOCAL_RANK"), 9);
    long port = colon != NULL ? ddprun_progress_parse_digits_(colon + 1, 5) : -1;
    size_t token_length = token != NULL ? strlen(token) : 0;
    char host[INET_ADDRSTRLEN];
    union {
      struct sockaddr any;
      struct sockaddr_in in;
    } peer;
    size_t i;

    state = -1;
    if (colon == NULL || round < 0 || local_rank < 0 || port < 1 || port > 65535) return;
    if (token_length == 0 || token_length > 64) return;
    for (i = 0; i < token_length; ++i) {
      if (strchr("0123456789abcdefABCDEF", token[i]) == NULL) return;
    }
    if (DDPRUN_PROGRESS_CAST_(size_t, colon - address) >= sizeof host) return;
    memcpy(host, address, DDPRUN_PROGRESS_CAST_(size_t, colon - address));
    host[colon - address] = '\0';
    memset(&peer, 0, sizeof peer);
    peer.in.sin_family = AF_INET;
    peer.in.sin_port = htons(DDPRUN_PROGRESS_CAST_(unsigned short, port));
    if (inet_pton(AF_INET, host, &peer.in.sin_addr) != 1) return;
    if (snprintf(prefix, sizeof prefix, "ddprun1 %s %ld %ld step ", token, round, local_rank) < 0) {
      return;
    }
    fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) return;
    /* Not inherited by programs this one execs; connect only records the peer (UDP). */
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (connect(fd, &peer.any, sizeof peer.in) != 0) {
      (void)close(fd);
      fd = -1;
      return;
    }
    pid = getpid();
    state = 1;
  }
  if (state != 1 || step < 0) return;
  if (clock_gettime(CLOCK_MONOTONIC, &now) != 0) return;
  if (have_sent) {
    long long elapsed_ns = DDPRUN_PROGRESS_CAST_(long long, now.tv_sec - last_sent.tv_sec) * 1000000000LL +
                           (now.tv_nsec - last_sent.tv_nsec);
    if (elapsed_ns < 100000000LL) return; /* at most one beacon per 0.1 s */
  }
  /* A forked child would speak for its parent's rank. */
  if (getpid() != pid) return;
  length = snprintf(datagram, sizeof datagram, "%s%lld -1 0", prefix, step);
  if (length < 0 || DDPRUN_PROGRESS_CAST_(size_t, length) >= sizeof datagram) return;
  /* MSG_DONTWAIT: a full buffer drops the beacon rather than wait; errors such as ECONNREFUSED
     (no agent listening) are ignored. */
  (void)send(fd, datagram, DDPRUN_PROGRESS_CAST_(size_t, length), MSG_DONTWAIT);
  last_sent = now;
  have_sent = 1;
}

#undef DDPRUN_PROGRESS_CAST_

#endif /* DDPRUN_PROGRESS_H */
