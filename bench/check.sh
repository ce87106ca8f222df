#!/usr/bin/env bash
# `ddprun check` on each example job file (validate + print the plan), with hyperfine.
#   RUNS (default 20)
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-20}
S=check
cd "$REPO"
wait_quiet "check"
for f in examples/*.toml; do
  hf -N --runs "$RUNS" --warmup 3 "$DDPRUN check $f"
  record_hyperfine check "$S" "\`ddprun check $f\`" ddprun "$HF_JSON" \
    "hyperfine -N --runs $RUNS --warmup 3 \"$(rel "$DDPRUN") check $f\""
done
