#!/usr/bin/env bash
# Benchmark worker, the same for ddprun and torchrun. It reads only the torch-style variables
# (RANK, TORCHELASTIC_RESTART_COUNT) and appends one line per event to $BENCH_MARKS:
#   start|fail|term|done  RANK  ROUND  EPOCH_SECONDS
# ($EPOCHREALTIME: no fork, so the time is taken right at the event). Its pid and the pid of
# its sleep go to $BENCH_MARKS.pids so the bench scripts can check none outlives its agent.
#
# MODE=true   write "start" and exit 0
# MODE=sleep  sleep SLEEP_S, then exit 0
# MODE=fail   rank FAIL_RANK exits 1 after FAIL_AFTER_S in the rounds listed in FAIL_ROUNDS
#             (default: every round), writing "fail" just before it exits; every other worker
#             sleeps SLEEP_S; SIGTERM makes it write "term" and exit 143 at once.
round=${TORCHELASTIC_RESTART_COUNT:-${RESTART_COUNT:-0}}
rank=${RANK:-0}
echo "start $rank $round $EPOCHREALTIME" >>"$BENCH_MARKS"
[[ "${MODE:-true}" == true ]] && exit 0
echo "$$" >>"$BENCH_MARKS.pids"

if [[ "${MODE}" == fail && "$rank" == "${FAIL_RANK:-3}" ]] &&
  [[ " ${FAIL_ROUNDS:-$round} " == *" $round "* ]]; then
  sleep "${FAIL_AFTER_S:-1}"
  echo "fail $rank $round $EPOCHREALTIME" >>"$BENCH_MARKS"
  exit 1
fi

trap 'echo "term $rank $round $EPOCHREALTIME" >>"$BENCH_MARKS"; kill "$child" 2>/dev/null; exit 143' TERM
sleep "${SLEEP_S:-30}" &
child=$!
echo "$child" >>"$BENCH_MARKS.pids"
wait "$child"
echo "done $rank $round $EPOCHREALTIME" >>"$BENCH_MARKS"
