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
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}

case "${1:-embedded}" in
  paper) shift; exec $PY -m verl.trainer.main_ppo --config-name router_r1 trainer.backend=ray "$@" ;;  # Ray places trainer.n_gpus_per_node GPU workers
  grpo)  shift; exec $PY -m verl.trainer.main_ppo --config-name router_r1_grpo "$@" ;;
  embedded) [ $# -gt 0 ] && shift ;;
  *=*) ;;  # overrides for the embedded default
  *) echo "usage: bash train.sh [embedded|paper|grpo] [key=value ...]" >&2; exit 2 ;;
esac

# Sizes (environment variables; the defaults are the embedded default, the test shrinks them)
OUT=${OUT:-outputs/embedded}
N_ORACLE=${N_ORACLE:-2000}      # oracle trajectories for SFT
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
if [ -z "$SFT_FROM" ]; then
stage "1/5 oracle trajectories, tokenizer, model config"
ORACLE_FLAGS=(${NOISE:+--noise "$NOISE"} ${PREFER_BIG:+--prefer-big "$PREFER_BIG"} ${CONFUSE:+--confuse "$CONFUSE"}
  ${RENAME:+--rename "$RENAME"})
case "$WHOLE_NAMES" in 1) ORACLE_FLAGS+=(--whole-names) ;; 0) ORACLE_FLAGS+=(--no-whole-names) ;; esac
$PY -m sim.warm_start --recipe "$RECIPE" --out-dir "$OUT/oracle" --n "$N_ORACLE" ${ORACLE_FLAGS[@]+"${ORACLE_FLAGS[@]}"} --report

stage "2/5 simulated QA data"
$PY -m sim.qa --out-dir "$OUT/data" --prompt-template "$OUT/oracle/prompt_template.txt" \
  --train-size 2000 --val-size 100 --test-size 300

stage "3/5 supervised warm start"
$PY -m verl.trainer.main_ppo --config-name sft "data.sft_files=[$OUT/oracle/oracle.parquet]" \
  "model.path=$OUT/oracle/model.json" "model.tokenizer=$OUT/oracle/tokenizer" \
  "trainer.output_dir=$OUT/sft" "trainer.hf_dir=$OUT/sft" trainer.resume=none trainer.total_epochs="$SFT_EPOCHS" \
  trainer.total_steps="${SFT_MAX_STEPS:-null}" trainer.time_limit_s="${SFT_TIME_LIMIT:-null}" \
  actor.lr=5e-3 data.train_batch_size=16 actor.sft_context_loss_weight=1.0 \
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
EVAL="$PY -m router_r1.eval.evaluate --data $SRC/data/test.parquet --pool configs/pool/sim.yaml --pool-url $URL \
  --greedy ${EVAL_LIMIT:+--limit $EVAL_LIMIT}"  # turns, lengths, alpha: the run's (OUT/hf/run_config.yaml)
$PY -m verl.trainer.main_ppo --config-name embedded \
  "data.train_files=[$SRC/data/train.parquet]" "data.val_files=[$SRC/data/val.parquet]" \
  "model.path=$SRC/sft" "model.tokenizer=$SRC/sft" "env.pool_url=$URL" "trainer.output_dir=$OUT/ppo" \
  "data.prompt_template=$SRC/oracle/prompt_template.txt" "$@"
rm -rf "$OUT/hf" && cp -r "$OUT/ppo/hf" "$OUT/hf"  # what infer.py and test.sh load by default
BASELINE_ARGS=()
for b in $EVAL_BASELINES; do BASELINE_ARGS+=(--baseline "$b"); done
$EVAL --checkpoint "$SRC/sft" --checkpoint "$OUT/hf" --out "$OUT/eval" "${BASELINE_ARGS[@]}"

stage "done: metrics $OUT/ppo/metrics.jsonl, curves $OUT/ppo/curves.png, evaluation $OUT/eval"
[ -z "$CUT" ] || echo "WARNING: $CUT: PPO started from a partly trained warm start, so these results are not the embedded default's"
