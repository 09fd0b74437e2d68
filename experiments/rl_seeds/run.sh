#!/usr/bin/env bash
# RL above its warm start over 3 seeds (issue 43): for each SEED, a fresh warm start (train.sh SFT_ONLY=1, its own
# annotator draws, SFT init and batch order), then the default recipe's PPO and GRPO from it, each evaluated greedily
# beside that warm start on the 300 test questions (paired). The first seed's PPO run also evaluates every baseline.
#   bash experiments/rl_seeds/run.sh OUT                    SEEDS ("1 2 3"); GRPO (the GRPO arm's overrides)
#   STEPS=200 bash experiments/rl_seeds/run.sh OUT          both arms trainer.total_steps=200 (default: the recipe's)
# A warm start already in OUT/warm_s<seed> is reused (a link to another run's is fine).
# Records: python -m experiments.rl_seeds.summarize --collect OUT --records docs/results/rl_seeds
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: run.sh OUT}
export PYTHON=${PYTHON:-python} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
SEEDS=${SEEDS:-1 2 3}
GRPO=${GRPO:-algorithm.adv_estimator=grpo rollout.n=4 data.train_batch_size=16}
STEPS_ARG=${STEPS:+trainer.total_steps=$STEPS}
mkdir -p "$OUT"
for s in $SEEDS; do
  (
    [ -f "$OUT/warm_s$s/sft/model.safetensors" ] || SEED=$s SFT_ONLY=1 OUT="$OUT/warm_s$s" bash train.sh > "$OUT/warm_s$s.log" 2>&1
    base=""; [ "$s" = "$(set -- $SEEDS; echo "$1")" ] && base=all
    SEED=$s SFT_FROM="$OUT/warm_s$s" OUT="$OUT/ppo_s$s" EVAL_BASELINES="$base" bash train.sh $STEPS_ARG > "$OUT/ppo_s$s.log" 2>&1 &
    # shellcheck disable=SC2086
    SEED=$s SFT_FROM="$OUT/warm_s$s" OUT="$OUT/grpo_s$s" EVAL_BASELINES= bash train.sh $GRPO $STEPS_ARG > "$OUT/grpo_s$s.log" 2>&1 &
    wait
  ) &
done
wait
