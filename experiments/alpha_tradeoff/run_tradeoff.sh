#!/usr/bin/env bash
# Issue 31's experiment (experiments/alpha_conditioned/run_alpha.sh) on configs/pool/sim_tradeoff.yaml, where the
# per-alpha oracle's routes change with alpha, at the embedded default's SFT size (6 epochs, 750 steps) and 40 PPO
# steps: about 65 min on two idle CPU cores, 2-3x that on cores shared with other jobs.
#
#   bash experiments/alpha_tradeoff/run_tradeoff.sh          (outputs/alpha_tradeoff; results in docs/results/alpha_tradeoff)
#   SFT_EPOCHS=3 PPO_STEPS=16 bash ...                        the cut run of README.md (3 epochs were too few)
#
# Every run gets the same budget: 2,000 oracle rows and SFT_EPOCHS epochs of SFT (the conditioned router on rows
# of all four alphas, each fixed run on its own alpha's rows), then PPO_STEPS PPO steps. No model of this pool is
# unseen, so the unseen-model part is skipped. Any knob of run_alpha.sh can still be set from the environment.
set -euo pipefail
cd "$(dirname "$0")/../.."
export POOL=${POOL:-configs/pool/sim_tradeoff.yaml}
export OUT=${OUT:-outputs/alpha_tradeoff} RESULTS=${RESULTS:-docs/results/alpha_tradeoff}
export SFT_EPOCHS=${SFT_EPOCHS:-6} PPO_STEPS=${PPO_STEPS:-40}
export UNSEEN_ALPHAS=${UNSEEN_ALPHAS-}                 # none: the pool has no unseen model
export CALIBRATE_TARGET=${CALIBRATE_TARGET:-0.004}     # USD per 1,000 validation questions (the planner: 2.6-5.7)
exec bash experiments/alpha_conditioned/run_alpha.sh
