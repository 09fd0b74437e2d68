#!/usr/bin/env bash
# Issues 43.5 and 44.2 on Gemma 3 270M: the format-only warm starts (routes drawn uniformly among the listed
# models), the domain listing's (43.5) or the card listing's (44.2), each trained by PPO at alpha 0 from its own
# SFT, within one device call (PPO for PPO_TIME seconds). Run as run_gemma.sh is (the bundle's pieces carried by
# earlier calls):
#   bash experiments/gemma_h200/run_gemma_uniform.sh DIR                     # DIR/domain: run_gemma.sh's outputs
#   LISTINGS="domain card" bash experiments/gemma_h200/run_gemma_uniform.sh DIR   # both, side by side (an H200)
# The RL flags are the embedded name-floor arm's (experiments/forked_groups: dw10_klc_lr2_mb16_floor2) at the
# GPU recipe's learning rate: the names' advantage x10 without KL on them, a floor under each name's probability.
# Session 27 (docs/results/h200/gemma_uniform_s27, an H100): these flags broke Gemma's two-hop turns (card: -0.070)
# and diverged on the domain listing.
set -uo pipefail
RESULTS=${1:?where the results go}
# Two listings side by side need the H200's 141 GB: on an 80 GB H100 the second SFT ran out of memory (session 27),
# and one after the other they do not fit a 600 s call. Refuse before the bundle is unpacked.
read -ra listings <<< "${LISTINGS:-domain}"
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ "${#listings[@]}" -gt 1 ] && [ "${mib:-0}" -lt 120000 ] && [ -z "${SIDE_BY_SIDE:-}" ]; then
  echo "run_gemma_uniform.sh: LISTINGS=\"${listings[*]}\" runs side by side and needs ~120 GB of GPU memory;" \
    "this GPU has ${mib:-no} MiB. Run one listing a call (LISTINGS=domain, then LISTINGS=card), or SIDE_BY_SIDE=1." >&2
  exit 2
fi
source "$(dirname "$0")/gemma_bundle.sh"  # unpack and install once, before the two runs share it
# batch 128: twice the GPU recipe's episodes a step, the one run alone on the GPU
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ROLLOUT=hf_static ALPHAS=${ALPHAS:-0} BATCH=${BATCH:-128}
export MICRO=${MICRO:-16} STEPS=${STEPS:-400} LIMIT=${LIMIT:-560} SFT_TIME_LIMIT=${SFT_TIME_LIMIT:-150}
export ACTOR_LR=${ACTOR_LR:-2e-5}
PPO_TIME=${PPO_TIME:-260}  # seconds of PPO, so that the evaluation still fits the call
export PPO_FLAGS="actor.use_kl_loss=true actor.kl_loss_coef=0.1 algorithm.decision_parts=[route_model,think_model]
  algorithm.decision_adv_weight=10 algorithm.decision_kl_weight=0 algorithm.name_floor=0.02
  trainer.time_limit_s=$PPO_TIME trainer.test_freq=20 ${PPO_FLAGS:-}"
for listing in "${listings[@]}"; do
  recipe=configs/recipes/uniform_routes.yaml
  [ "$listing" = card ] && recipe=configs/recipes/uniform_card.yaml
  RUN=/tmp/gemma_$listing ORACLE_FLAGS="--recipe $recipe" bash "$(dirname "$0")/run_gemma.sh" "$RESULTS/$listing" &
done
wait
