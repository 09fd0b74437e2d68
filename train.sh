#!/usr/bin/env bash
# Train a router.
#   bash train.sh                 the embedded default: a small router from scratch on CPU
#   bash train.sh paper [k=v ...] the paper's settings (configs/router_r1.yaml)
#   bash train.sh grpo  [k=v ...] the GRPO variant (configs/router_r1_grpo.yaml)
# Extra key=value arguments are hydra overrides, as in veRL (trainer.total_steps=10).
#
# The embedded default, step by step (outputs under $OUT, default outputs/embedded):
#   1. noisy oracle trajectories from the simulated world, the BPE tokenizer, the model config
#   2. the simulated QA data (train/val/test parquet) with the same prompt template
#   3. supervised warm start on the oracle trajectories (the same trainer, trainer.mode=sft: configs/sft.yaml)
#   4. the simulated pool server on a free loopback port
#   5. PPO against the pool, then both models evaluated on the held-out test questions
# Stages 1-3 can be shared: SFT_ONLY=1 stops after them, SFT_FROM=DIR skips them and starts
# PPO from DIR's data and SFT model (an alpha sweep from one warm start:
#   SFT_FROM=outputs/embedded OUT=outputs/embedded_alpha06 bash train.sh env.alpha=0.6; the evaluation
#   reads the run's settings, alpha included, from the run_config.yaml the run writes beside its model).
#
# The world and the run's seed (environment variables; the defaults are the embedded default's):
#   WORLD_SEED=0  the simulated world: the annotator's world, the QA data's, the pool server's (--seed), the
#                 env's answer key (env.sim_seed) and the evaluation's (--sim-seed) all follow it
#   POOL          the pool yaml (a simulated one, `world: sim`; default: the recipe's `pool`, else
#                 configs/pool/sim.yaml): the models the annotator routes to and the prompts list, the pool
#                 server's experts, env.pool and the evaluation's --pool
#   SEED=1        the run's seed: the annotator's draws (its --seed SEED-1), SFT's batch order and init
#                 (data.seed, model.seed SEED-1), SFT's and PPO's trainer.seed (SEED); SEED=1 is today's
#                 run, so 3 seeds with fresh warm starts are SEED=1, 2, 3 bash train.sh
# SFT_FROM reuses DIR's world (DIR/world.env); a WORLD_SEED or POOL other than DIR's is refused.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}

case "${1:-embedded}" in
  paper) shift; exec $PY -m verl.trainer.main_ppo --config-name router_r1 trainer.backend=ray "$@" ;;  # Ray places trainer.n_gpus_per_node GPU workers
  grpo)  shift; exec $PY -m verl.trainer.main_ppo --config-name router_r1_grpo trainer.backend=ray "$@" ;;  # as paper
  embedded) [ $# -gt 0 ] && shift ;;
  *=*) ;;  # overrides for the embedded default
  *) echo "usage: bash train.sh [embedded|paper|grpo] [key=value ...]" >&2; exit 2 ;;
esac

# Sizes (environment variables; the defaults are the embedded default, the test shrinks them)
OUT=${OUT:-outputs/embedded}
SEED=${SEED:-1}
N_ORACLE=${N_ORACLE:-}          # oracle trajectories for SFT; empty: the recipe's n (2000 in default.yaml)
TRAIN_SIZE=${TRAIN_SIZE:-3300}  # QA training questions, PPO's prompts (stage 2; SFT_FROM uses its source's data).
                                # A world's training split holds ~3,300-3,500 distinct ones; 3,300 instead of 2,000:
                                # RL - SFT +0.039 on average over 3 seeds instead of +0.029, seed 3 -0.010 -> +0.017
                                # (docs/results/rl_more_questions)
# The warm start's recipe (configs/recipes/default.yaml): the annotator routes each hop to its domain's cheap
# specialist, with a few slips. The earlier default (RECIPE=configs/recipes/confused.yaml, or NOISE=0.2
# PREFER_BIG=0.3 CONFUSE=0.8) left PPO a mix-up to undo but gave a warm start that routed 27% of calls wrong at
# 4x the cost (docs/results/router_quality). The knobs below override the recipe's values; empty: the recipe's.
RECIPE=${RECIPE:-configs/recipes/default.yaml}
NOISE=${NOISE:-}                # P(a random slip: wrong specialist, guess, whole question to anyone); recipe: 0.05
PREFER_BIG=${PREFER_BIG:-}      # P(the annotator sends the question to the strongest, dearest generalist); recipe: 0
CONFUSE=${CONFUSE:-}            # P(a people/science hop goes to the cheap model the annotator mistakes for its specialist); 0
# Names: each entity name one token (WHOLE_NAMES=1) and every trajectory's entities renamed to others of the
# world (RENAME=1), so the policy learns to copy any name, not the train questions' (SFT warm start EM 0.46 -> 0.86,
# docs/results/router_quality); the recipe's. WHOLE_NAMES=0 RENAME=0: a token per word and the questions' own names.
WHOLE_NAMES=${WHOLE_NAMES:-}    # 1 or 0
RENAME=${RENAME:-}              # share of trajectories renamed
SFT_EPOCHS=${SFT_EPOCHS:-6}
SFT_MAX_STEPS=${SFT_MAX_STEPS:-}  # cap on SFT optimizer steps (empty: all epochs)
SFT_TIME_LIMIT=${SFT_TIME_LIMIT:-}  # seconds; empty (default): none, so a slow machine trains the same model as a fast
                                   # one. A run it cuts stops mid-schedule at a high lr (EM 0.18): said after SFT and at the end
SFT_FROM=${SFT_FROM:-}          # reuse stages 1-3 of an earlier run (its OUT)
EVAL_LIMIT=${EVAL_LIMIT:-}      # test questions per file in the final evaluation (empty: all 300)
EVAL_BASELINES=${EVAL_BASELINES-all}  # baselines beside the router in the final evaluation (space-separated
                                      # --baseline values; all = every single model, oracle, oracle-hops, knn, mlp;
                                      # empty: none). knn/mlp ask each model the train questions once, cached.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
start=$(date +%s)
stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }
sft_cut() {  # why the SFT run in $1 stopped before its planned steps (sft_summary.json); nothing if it finished
  [ -f "$1/sft_summary.json" ] && $PY -c 'import json, sys; s = json.load(open(sys.argv[1]))
if s["stopped"] != "done": print("SFT stopped early at step %d of %d (%s)" % (s["steps"], s["planned_steps"], s["stopped"]))' \
    "$1/sft_summary.json" || true
}

SRC=${SFT_FROM:-$OUT}  # where the data and the SFT model are
from_src() { [ -f "$SRC/world.env" ] && sed -n "s/^$1=//p" "$SRC/world.env" || true; }  # SFT_FROM's world
if [ -n "$SFT_FROM" ]; then
  for key in WORLD_SEED POOL; do
    was=$(from_src $key); now=${!key:-}
    if [ -n "$was" ] && [ -n "$now" ] && [ "$now" != "$was" ] && \
       { [ $key = WORLD_SEED ] || [ "$(realpath -m "$now")" != "$(realpath -m "$was")" ]; }; then
      echo "error: $key=$now, but SFT_FROM=$SFT_FROM was built with $key=$was ($SFT_FROM/world.env);" \
           "its data and warm start belong to that world" >&2; exit 2
    fi
    [ -n "$now" ] || printf -v "$key" '%s' "$was"
  done
fi
WORLD_SEED=${WORLD_SEED:-0}
if [ -z "${POOL:-}" ] && [ -z "$SFT_FROM" ]; then  # the recipe's pool, if it names one (alpha.yaml does)
  POOL=$($PY -c 'import sys; from sim.warm_start.recipe import RecipeError, load_sections
try: print(load_sections(sys.argv[1]).get("build", {}).get("pool", ""))
except RecipeError as e: sys.exit(f"error: {e}")' "$RECIPE")
fi
POOL=${POOL:-configs/pool/sim.yaml}
[[ "$WORLD_SEED" =~ ^[0-9]+$ ]] || { echo "error: WORLD_SEED must be an integer >= 0, got '$WORLD_SEED'" >&2; exit 2; }
[[ "$SEED" =~ ^[1-9][0-9]*$ ]] || { echo "error: SEED must be an integer >= 1, got '$SEED'" >&2; exit 2; }
[ -f "$POOL" ] || { echo "error: POOL=$POOL: no such file (read from the repository root, as OUT is)" >&2; exit 2; }
printf 'WORLD_SEED=%s\nPOOL=%s\n' "$WORLD_SEED" "$POOL" > "$OUT/world.env"  # SFT_FROM=$OUT reads it
echo "world seed $WORLD_SEED, pool $POOL, run seed $SEED"
if [ -z "$SFT_FROM" ]; then
stage "1/5 oracle trajectories, tokenizer, model config"
ORACLE_FLAGS=(${N_ORACLE:+--n "$N_ORACLE"} ${NOISE:+--noise "$NOISE"} ${PREFER_BIG:+--prefer-big "$PREFER_BIG"}
  ${CONFUSE:+--confuse "$CONFUSE"} ${RENAME:+--rename "$RENAME"})
case "$WHOLE_NAMES" in 1) ORACLE_FLAGS+=(--whole-names) ;; 0) ORACLE_FLAGS+=(--no-whole-names) ;; esac
$PY -m sim.warm_start --recipe "$RECIPE" --out-dir "$OUT/oracle" --seed $((SEED - 1)) \
  --world-seed "$WORLD_SEED" --pool "$POOL" ${ORACLE_FLAGS[@]+"${ORACLE_FLAGS[@]}"} --report

stage "2/5 simulated QA data"
$PY -m sim.qa --out-dir "$OUT/data" --prompt-template "$OUT/oracle/prompt_template.txt" \
  --world-seed "$WORLD_SEED" --pool "$POOL" --train-size "$TRAIN_SIZE" --val-size 100 --test-size 300

stage "3/5 supervised warm start"
$PY -m verl.trainer.main_ppo --config-name sft "data.sft_files=[$OUT/oracle/oracle.parquet]" \
  "model.path=$OUT/oracle/model.json" "model.tokenizer=$OUT/oracle/tokenizer" \
  "trainer.output_dir=$OUT/sft" "trainer.hf_dir=$OUT/sft" trainer.resume=none trainer.total_epochs="$SFT_EPOCHS" \
  trainer.total_steps="${SFT_MAX_STEPS:-null}" trainer.time_limit_s="${SFT_TIME_LIMIT:-null}" \
  actor.lr=5e-3 data.train_batch_size=16 actor.sft_context_loss_weight=1.0 \
  trainer.seed="$SEED" data.seed=$((SEED - 1)) model.seed=$((SEED - 1)) \
  "data.prompt_template=$OUT/oracle/prompt_template.txt"  # written into the model dir: infer.py prompts as trained
else
  echo "stages 1-3 reused from $SFT_FROM"
fi
CUT=$(sft_cut "$SRC/sft")
[ -z "$CUT" ] || echo "WARNING: $CUT: the warm start is not the full schedule's model" >&2
[ -n "${SFT_ONLY:-}" ] && { stage "done: SFT model $SRC/sft${CUT:+ - WARNING: $CUT}"; exit 0; }

stage "4/5 simulated pool server"
source tools/sim_pool.sh
start_sim_pool "$OUT/pool_server.log"
echo "pool at $URL"

stage "5/5 PPO against the pool"
EVAL="$PY -m router_r1.eval.evaluate --data $SRC/data/test.parquet --pool $POOL --sim-seed $WORLD_SEED --pool-url $URL \
  --greedy ${EVAL_LIMIT:+--limit $EVAL_LIMIT}"  # turns, lengths, alpha: the run's (OUT/hf/run_config.yaml)
$PY -m verl.trainer.main_ppo --config-name embedded \
  "data.train_files=[$SRC/data/train.parquet]" "data.val_files=[$SRC/data/val.parquet]" \
  "model.path=$SRC/sft" "model.tokenizer=$SRC/sft" "env.pool=$POOL" "env.pool_url=$URL" "env.sim_seed=$WORLD_SEED" \
  "trainer.seed=$SEED" "trainer.output_dir=$OUT/ppo" \
  "data.prompt_template=$SRC/oracle/prompt_template.txt" "$@"
rm -rf "$OUT/hf" && cp -r "$OUT/ppo/hf" "$OUT/hf"  # what infer.py and test.sh load by default
BASELINE_ARGS=()
for b in $EVAL_BASELINES; do BASELINE_ARGS+=(--baseline "$b"); done
$EVAL --checkpoint "$SRC/sft" --checkpoint "$OUT/hf" --out "$OUT/eval" "${BASELINE_ARGS[@]}"

stage "done: metrics $OUT/ppo/metrics.jsonl, curves $OUT/ppo/curves.png, evaluation $OUT/eval"
[ -z "$CUT" ] || echo "WARNING: $CUT: PPO started from a partly trained warm start, so these results are not the embedded default's"
