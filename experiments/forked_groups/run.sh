#!/usr/bin/env bash
# RL from one warm start with and without forked prompt groups (env.branch_turns), over seeds (issue 44): each arm
# is train.sh from SFT_FROM at alpha 0.6, T 0.7, no KL loss, 300 steps; then a greedy evaluation beside the warm start
# (train.sh's), the policy's probability of each listed name at its routes (tools/analysis/route_probs), the summary.
#   bash experiments/forked_groups/run.sh SFT OUT     SFT: a warm start's OUT (train.sh SFT_ONLY=1), e.g. the card one:
#     RECIPE=configs/recipes/uniform_card.yaml SEED=1 OUT=SFT SFT_ONLY=1 EVAL_BASELINES= bash train.sh
# SEEDS ("1 2 3"); ARMS ("plain|forked"; "list" prints each arm's flags); PARALLEL (2) runs at a time, THREADS (1)
# each (2 cores: ~25 min a pair); STEPS (300); TIME_LIMIT (seconds of training a run, then it is saved and evaluated;
# empty: none); EXTRA (overrides for every arm, e.g. larger micro-batches on a GPU); ROUTE_PROBS=0 skips the
# route_probs reading (minutes a run).
# A run already evaluated in OUT (OUT/<arm>_s<seed>/eval/summary.json) is kept.
set -euo pipefail
set -f  # no globbing: the arms' flags go to train.sh as words, and [route_model,think_model] is a glob pattern
cd "$(dirname "$0")/../.."
SFT=${1:?usage: run.sh SFT OUT} OUT=${2:?usage: run.sh SFT OUT}
PY=${PYTHON:-python}
SEEDS=${SEEDS:-1 2 3} ARMS=${ARMS:-plain|forked} PARALLEL=${PARALLEL:-2}
# the model names' advantage x10 (they are ~7% of the policy's tokens), no forks: experiments/card_start's arms
NAMES_X10="algorithm.decision_parts=[route_model,think_model] algorithm.decision_adv_weight=10"
DW10="actor.use_kl_loss=false $NAMES_X10"
DW10_KLC="actor.use_kl_loss=true actor.kl_loss_coef=0.1 $NAMES_X10 algorithm.decision_kl_weight=0"
declare -A FLAGS=(
  [plain]="actor.use_kl_loss=false"
  [dw10]="$DW10"
  # ...with twice the learning rate, with the names' advantage x30, with 4x the prompts a step (one optimizer step an
  # epoch): which of them learns the routing table faster from the converged card start (experiments/card_start)
  [dw10_lr2]="$DW10 actor.lr=2e-4"
  [dw30]="actor.use_kl_loss=false algorithm.decision_parts=[route_model,think_model] algorithm.decision_adv_weight=30"
  [dw10_x4]="$DW10 data.train_batch_size=128 actor.ppo_mini_batch_size=128 critic.ppo_mini_batch_size=128"
  # ...one PPO epoch a batch (two lock the bandit's marginal in: docs/results/route_credit), at lr 1e-4 and 2e-4
  [dw10_1ep]="$DW10 actor.ppo_epochs=1"
  [dw10_1ep_lr2]="$DW10 actor.ppo_epochs=1 actor.lr=2e-4"
  # ...with an entropy bonus on the names alone (algorithm.decision_entropy_coef): the names' sampling spread falls to
  # ~0.25 nats while science, business and sports still go to the marginal favourite
  [dw10_ent03]="$DW10 algorithm.decision_entropy_coef=0.3"
  [dw10_ent1]="$DW10 algorithm.decision_entropy_coef=1"
  [dw10_ent3]="$DW10 algorithm.decision_entropy_coef=3"
  # ...with the KL loss (0.1) back on every token but the names (algorithm.decision_kl_weight=0): the anchor holds
  # the copies that slip at lr 2e-4 while the route leaves the warm start's uniform draw freely
  [dw10_klc]="$DW10_KLC"
  [dw10_klc_lr2]="$DW10_KLC actor.lr=2e-4"
  [dw10_klc_lr3]="$DW10_KLC actor.lr=3e-4"
  # ...half the episodes a step (16): 4x the episodes did not learn faster a step, so in 44.2's 30 minutes on 2 cores
  # half of them might buy more optimizer steps (measured: 1.5x the steps, the same EM; docs/results/card_start)
  [dw10_klc_lr2_b16]="$DW10_KLC actor.lr=2e-4 data.train_batch_size=16 actor.ppo_mini_batch_size=16
    critic.ppo_mini_batch_size=16"
  # ...more optimizer steps from the same episodes (the clip fraction is ~0.1% and the PPO KL ~1e-3 a step, so each
  # batch moves the policy little): mini-batches of 16 or 8 (4 or 8 Adam steps a batch at the same compute), or 4
  # epochs (4 steps, twice the update's compute). Measured (mb16, 30 minutes on 2 cores): level with 2 steps on one
  # paired seed, and one of 3 seeds stopped naming a model (docs/results/card_start)
  [dw10_klc_lr2_mb16]="$DW10_KLC actor.lr=2e-4 actor.ppo_mini_batch_size=16 critic.ppo_mini_batch_size=16"
  [dw10_klc_lr2_mb8]="$DW10_KLC actor.lr=2e-4 actor.ppo_mini_batch_size=8 actor.ppo_micro_batch_size=8
    critic.ppo_mini_batch_size=8 critic.ppo_micro_batch_size=8"
  [dw10_klc_lr2_4ep]="$DW10_KLC actor.lr=2e-4 actor.ppo_epochs=4"
  # ...mb16 with the entropy bonus on the names (1): mb16's seed 3 took a name from 0.22 of the sampled routes to 0 in
  # two steps at 0.01-0.2 nats of the think's name surprisal, and no route came back. Measured: the bonus keeps 0.1-0.6
  # nats, and a best model's name still died in 1 of 7 runs, as without it (docs/results/card_start)
  [dw10_klc_lr2_mb16_ent1]="$DW10_KLC actor.lr=2e-4 actor.ppo_mini_batch_size=16 critic.ppo_mini_batch_size=16
    algorithm.decision_entropy_coef=1"
  # ...mb16 with a floor of 0.02 under each pool name's mean probability at the think's choices (algorithm.name_floor):
  # the hinge reaches a name no episode sampled, so a name cannot die in one update as in seed 3 above
  [dw10_klc_lr2_mb16_floor2]="$DW10_KLC actor.lr=2e-4 actor.ppo_mini_batch_size=16 critic.ppo_mini_batch_size=16
    algorithm.name_floor=0.02"
  # ...half that floor (0.01): the 0.02 floor's runs kept every name but sent fewer hops to the best model at ~250 steps
  [dw10_klc_lr2_mb16_floor1]="$DW10_KLC actor.lr=2e-4 actor.ppo_mini_batch_size=16 critic.ppo_mini_batch_size=16
    algorithm.name_floor=0.01"
  # 8 prompts x 4 forked episodes: the plain arm's 32 episodes a step; forks at the first or the second route
  [forked]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=8"
  # the same with the model names' advantage x10 (the names are ~7% of the policy's tokens)
  [forked_dw10]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=8
    algorithm.decision_parts=[route_model,think_model] algorithm.decision_adv_weight=10"
  # the fork turns alone (algorithm.fork_only), names x10: the bandit of tools/analysis/route_ascent in whole episodes
  [fork_only_dw10]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=8
    algorithm.fork_only=true algorithm.decision_parts=[route_model,think_model] algorithm.decision_adv_weight=10"
  # ...names x100: in Adam's normalised step, nearly the names alone (the bandit's loss)
  [fork_only_dw100]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=8
    algorithm.fork_only=true algorithm.decision_parts=[route_model,think_model] algorithm.decision_adv_weight=100"
  # one PPO epoch a batch (the bandit learns at this rate with single steps; run it with STEPS=600)
  [forked_1epoch]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=8
    actor.ppo_epochs=1"
  # 4x the prompts a step (128 episodes; a GPU's batch), one optimizer step an epoch: the bandit's rate of prefixes
  [plain_x4]="actor.use_kl_loss=false data.train_batch_size=128
    actor.ppo_mini_batch_size=128 critic.ppo_mini_batch_size=128"
  [forked_x4]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=32
    actor.ppo_mini_batch_size=128 critic.ppo_mini_batch_size=128"
  [forked_x4_dw10]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=32
    actor.ppo_mini_batch_size=128 critic.ppo_mini_batch_size=128
    algorithm.decision_parts=[route_model,think_model] algorithm.decision_adv_weight=10"
  # ...one PPO epoch a batch (two lock the bandit's marginal in: docs/results/route_credit), at lr 1e-4 and 2e-4
  [forked_x4_1ep]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=32
    actor.ppo_mini_batch_size=128 critic.ppo_mini_batch_size=128 actor.ppo_epochs=1"
  [forked_x4_1ep_lr2]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=32
    actor.ppo_mini_batch_size=128 critic.ppo_mini_batch_size=128 actor.ppo_epochs=1 actor.lr=2e-4"
  [plain_x4_1ep_lr2]="actor.use_kl_loss=false data.train_batch_size=128
    actor.ppo_mini_batch_size=128 critic.ppo_mini_batch_size=128 actor.ppo_epochs=1 actor.lr=2e-4"
  # GRPO's advantages everywhere: the shared trunk's cancel, every credit is relative to the siblings
  [forked_grpo_dw10]="actor.use_kl_loss=false env.branch_turns=[0,1] rollout.n=4 data.train_batch_size=8
    algorithm.adv_estimator=grpo algorithm.decision_parts=[route_model,think_model] algorithm.decision_adv_weight=10"
)
if [ "$ARMS" = list ]; then  # each arm's name and flags, one a line (tests/test_forked_groups_arms.py loads them)
  for a in "${!FLAGS[@]}"; do printf '%s\t%s\n' "$a" "$(printf '%s' "${FLAGS[$a]}" | tr -s ' \n' '  ')"; done
  exit 0
fi
[ -d "$SFT/sft" ] || { echo "run.sh: $SFT/sft: no warm start there (make one: train.sh with SFT_ONLY=1 OUT=$SFT)" >&2
  exit 2; }
COMMON="env.alpha=0.6 rollout.temperature=0.7 trainer.total_steps=${STEPS:-300}
  ${TIME_LIMIT:+trainer.time_limit_s=$TIME_LIMIT} ${EXTRA:-}"
mkdir -p "$OUT"
one() {  # arm seed
  local run="$OUT/$1_s$2"
  [ -f "$run/eval/summary.json" ] && return 0
  # shellcheck disable=SC2086  # the flags are words
  OMP_NUM_THREADS=${THREADS:-1} SEED=$2 SFT_FROM="$SFT" OUT="$run" EVAL_BASELINES= bash train.sh $COMMON ${FLAGS[$1]} \
    > "$run.log" 2>&1
  [ "${ROUTE_PROBS:-1}" = 0 ] && return 0
  OMP_NUM_THREADS=1 $PY -m tools.analysis.route_probs --checkpoint "$run/ppo/hf" --data "$SFT/data/test.parquet" \
    --trajectories "$run/eval/trajectories.jsonl" --run "SFT router" --pool configs/pool/sim.yaml \
    --out "$run/route_probs.md" >> "$run.log" 2>&1
}
IFS='|' read -ra arms <<< "$ARMS"
for s in $SEEDS; do
  for a in "${arms[@]}"; do
    [ -n "${FLAGS[$a]+x}" ] || { echo "run.sh: unknown arm $a (known: ${!FLAGS[*]})" >&2; exit 2; }
    one "$a" "$s" &
    while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n; done
  done
done
wait
$PY -m experiments.forked_groups.summarize "$OUT" --records "${RECORDS:-$OUT}"
