#!/usr/bin/env bash
# A node that never starts: a 2-node job where only node 0 is started. Time until node 0's
# agent gives up, its exit code, and what it says (its last lines). ddprun:
# timeouts.rendezvous = "20s"; torchrun: --rdzv_conf timeout=20, bounded at TR_BOUND_S (default
# 60 s; it needs about 325 s here, so it is normally reported as "> 60 s"). The two run at the
# same time (they only wait), which keeps the whole benchmark within its time budget.
source "$(dirname "$0")/common.sh"
TR_BOUND_S=${TR_BOUND_S:-60}
S=nostart
export MODE=true
dir=$(scratch nostart)
wait_quiet "never-started node"

free_port
ddprun_job "$dir/job.toml" nostart 2 2 "$PORT" 0 20s "[\"bash\", \"$W_MARK\"]"
new_marks "$dir"
t_d=$EPOCHREALTIME
start_agent "$dir" ddprun 60 "$DDPRUN" "$dir/job.toml" --node-rank 0

free_port
torchrun_args 2 2 0 "$PORT" 0 ""
TR_ARGS+=(--rdzv_conf timeout=20)
t_t=$EPOCHREALTIME
start_agent "$dir" torchrun "$TR_BOUND_S" "${TR_ARGS[@]}" bash "$W_MARK"

wait_agents "$dir" $((TR_BOUND_S + 10)) ddprun torchrun
read -r rc_d e_d <"$dir/ddprun.rc"
read -r rc_t e_t <"$dir/torchrun.rc"
el_d=$(awk -v a="$t_d" -v b="$e_d" 'BEGIN {printf "%.3f", b - a}')
el_t=$(awk -v a="$t_t" -v b="$e_t" 'BEGIN {printf "%.3f", b - a}')
if ((rc_t == 124 || rc_t == 137)); then el_t="> $TR_BOUND_S (killed by timeout)"; fi

cmd_d="timeout -k 5 60 $(rel "$DDPRUN") job.toml --node-rank 0 (job.toml: nnodes = 2, devices = 2, rendezvous = \"20s\"; node 1 never started)"
cmd_t="timeout -k 5 $TR_BOUND_S ${TR_ARGS[*]} bash bench/w_mark.sh (node 1 never started)"
record nostart-time "$S" "2 nodes, node 1 never started: node 0's agent gives up after (s)" ddprun "$el_d" - - 1 s "$cmd_d"
record nostart-time "$S" "2 nodes, node 1 never started: node 0's agent gives up after (s)" torchrun "$el_t" - - 1 s "$cmd_t"
record nostart-rc "$S" "exit code of node 0's agent" ddprun "$rc_d" - - 1 text "$cmd_d"
record nostart-rc "$S" "exit code of node 0's agent" torchrun "$rc_t" - - 1 text "$cmd_t"
# What they say: ddprun's last line that names the missing node; torchrun's last line.
say_d=$(grep -m1 'never joined' "$dir/ddprun.out" || tail -1 "$dir/ddprun.out")
say_t=$(grep -v '^\*\|^$\|OMP_NUM_THREADS\|^WARNING:__main__:$' "$dir/torchrun.out" | tail -1 || true)
[[ -z "$say_t" ]] && say_t="(nothing after the OMP_NUM_THREADS banner)"
record nostart-say "$S" "what node 0's agent says" ddprun "\`${say_d//|/\\|}\`" - - 1 text "$cmd_d"
record nostart-say "$S" "what node 0's agent says" torchrun "${say_t//|/\\|}" - - 1 text "$cmd_t"
cp "$dir/ddprun.out" "$BENCH_OUT/nostart-ddprun.out"
cp "$dir/torchrun.out" "$BENCH_OUT/nostart-torchrun.out"
