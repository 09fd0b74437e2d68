#!/usr/bin/env bash
# Issue 31's experiment (docs/results/alpha_conditioned/run_alpha.sh) on configs/pool/sim_tradeoff.yaml, where the
# per-alpha oracle's routes change with alpha, at the size that fitted 2 shared CPU cores in one session:
#
#   bash docs/results/alpha_tradeoff/run_tradeoff.sh          (outputs/alpha_tradeoff; results here)
#
# Every run gets the same budget: 2,000 oracle rows and SFT_EPOCHS epochs of SFT (the conditioned router on rows
# of all four alphas, each fixed run on its own alpha's rows), then PPO_STEPS PPO steps. No model of this pool is
# unseen, so the unseen-model part is skipped. Any knob of run_alpha.sh can still be set from the environment.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export POOL=${POOL:-configs/pool/sim_tradeoff.yaml}
export OUT=${OUT:-outputs/alpha_tradeoff} RESULTS=${RESULTS:-docs/results/alpha_tradeoff}
export SFT_EPOCHS=${SFT_EPOCHS:-5} PPO_STEPS=${PPO_STEPS:-24}
export UNSEEN_ALPHAS=${UNSEEN_ALPHAS-}                 # none: the pool has no unseen model
export CALIBRATE_TARGET=${CALIBRATE_TARGET:-0.004}     # USD per 1,000 validation questions (the planner: 2.6-5.7)
exec bash docs/results/alpha_conditioned/run_alpha.sh
