#!/usr/bin/env bash
# RL against its own warm start (issue 43): one SFT warm start, then PPO arms from it, each evaluated greedily on
# the 300 test questions beside the warm start (paired), with greedy validation every 10 steps.
#   bash experiments/rl_warm_start/run.sh OUT ARM [ARM ...]       ARM = name:override[,override...]
#   bash experiments/rl_warm_start/run.sh /tmp/rl lr3e-4:actor.lr=3e-4 top_p0.7:rollout.top_p=0.7 lr1e-4:actor.lr=1e-4
# STEPS (100) PPO steps per arm; SEED (1) trainer.seed; JOBS (1) arms run at once; the warm start is built once
# under OUT/warm (train.sh SFT_ONLY=1) unless it is there. Records: python -m experiments.rl_warm_start.summarize.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT ARM [ARM ...]}; shift
export PYTHON=${PYTHON:-python} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
STEPS=${STEPS:-100} SEED=${SEED:-1} JOBS=${JOBS:-1}
mkdir -p "$OUT"
[ -f "$OUT/warm/sft/model.safetensors" ] || SFT_ONLY=1 OUT="$OUT/warm" bash train.sh > "$OUT/warm.log" 2>&1
for arm in "$@"; do
  name=${arm%%:*}; overrides=${arm#*:}
  # shellcheck disable=SC2086
  SFT_FROM="$OUT/warm" OUT="$OUT/$name" EVAL_BASELINES= bash train.sh trainer.total_steps="$STEPS" \
    trainer.test_freq=10 trainer.seed="$SEED" ${overrides//,/ } > "$OUT/$name.log" 2>&1 &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || echo "an arm failed: see its log in $OUT" >&2; done
done
wait
