#!/usr/bin/env bash
# One router for every cost preference, against four fixed-alpha routers trained with the same budget, and a pool
# model it never saw (issue 31). On CPU at the embedded default's size unless the knobs below shrink it:
#
#   bash experiments/alpha_conditioned/run_alpha.sh                     the whole experiment (outputs/alpha_conditioned)
#   N_ORACLE=64 TRAIN_SIZE=64 TEST_SIZE=24 SFT_MAX_STEPS=4 PPO_STEPS=1 ... bash ...   a smoke (see SMOKE below)
#
# 1. data: alpha-conditioned oracle trajectories (sim/warm_start/alpha.py: each row's alpha drawn from
#    ALPHAS, stated in its prompt, its route the plan of highest expected reward at that alpha), one oracle set per
#    fixed alpha (the same planner at that alpha, plain prompts), the QA data; all on POOL, whose seen models are
#    configs/pool/sim.yaml's (sim_unseen.yaml adds SciGLM-6B, never in any training data or prompt)
# 2. SFT: the conditioned warm start, and each fixed run's (FIXED_SFT=own: on its own alpha's data, the same rows,
#    epochs and steps, where two alphas' SFT rows (prompts and trajectories) are identical one SFT serves both, the
#    model it would train twice; shared: one SFT on the first alpha's data for the four)
# 3. PPO, PPO_STEPS each: conditioned (env.alphas=ALPHAS, algorithm.whiten_by=alpha unless WHITEN_BY_ALPHA=0) and
#    one run per alpha of ALPHAS (env.alpha=A); the same batch, lr and steps for all five
# 4. evaluation on the test questions (greedy, the simulated pool in-process): the baselines (every single model,
#    oracle, oracle-hops, knn, mlp; BASELINES), each fixed run, the conditioned router told each of EVAL_ALPHAS;
#    the conditioned router told UNSEEN_ALPHAS with --include-unseen and a prompt listing SciGLM-6B, paired with
#    the same questions without; the conditioned router told A paired with the fixed run at A
# 5. one table and one Pareto plot (router_r1.eval.report), the paired tables, calibration of the conditioned router
#    for a cost target on the validation questions; copied to RESULTS (docs/results/alpha_conditioned)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PY=${PYTHON:-python} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
OUT=${OUT:-outputs/alpha_conditioned}
RESULTS=${RESULTS:-docs/results/alpha_conditioned}
POOL=${POOL:-configs/pool/sim_unseen.yaml}
ALPHAS=${ALPHAS:-0 0.3 0.6 0.9}                       # trained on (conditioned) and one fixed run each
EVAL_ALPHAS=${EVAL_ALPHAS:-0 0.15 0.3 0.45 0.6 0.7 0.8 0.9 1}  # the conditioned router is told each
UNSEEN_ALPHAS=${UNSEEN_ALPHAS-0 0.6 0.9}              # ... and at these also offered the unseen model (empty: none)
N_ORACLE=${N_ORACLE:-2000}                            # oracle trajectories per SFT set
NOISE=${NOISE:-0.05}                                  # P(a slip) in the oracle data, as train.sh
WHOLE_NAMES=${WHOLE_NAMES:-1}                         # each entity name one token, as train.sh (issue 32)
RENAME=${RENAME:-1}                                   # share of SFT rows whose entities are renamed, as train.sh
TRAIN_SIZE=${TRAIN_SIZE:-2000} VAL_SIZE=${VAL_SIZE:-100} TEST_SIZE=${TEST_SIZE:-300}
SFT_EPOCHS=${SFT_EPOCHS:-6}
SFT_MAX_STEPS=${SFT_MAX_STEPS:-}                      # cap on SFT steps (empty: all epochs)
FIXED_SFT=${FIXED_SFT:-own}                           # own | shared
PPO_STEPS=${PPO_STEPS:-40}
PPO_ARGS=${PPO_ARGS:-}                                # extra hydra overrides for all five PPO runs
WHITEN_BY_ALPHA=${WHITEN_BY_ALPHA:-1}
EVAL_LIMIT=${EVAL_LIMIT:-}                            # test questions per file (empty: all)
BASELINES=${BASELINES-all}                            # --baseline values (empty: none)
CALIBRATE_TARGET=${CALIBRATE_TARGET:-0.005}           # USD per 1,000 validation questions (empty: no calibration)
MODEL=${MODEL:-}                                      # JSON over the embedded policy's config (a smoke shrinks it)
# SMOKE (about 3 min on 2 idle cores): N_ORACLE=64 TRAIN_SIZE=64 VAL_SIZE=8 TEST_SIZE=24 SFT_EPOCHS=1 SFT_MAX_STEPS=4
#   PPO_STEPS=1 EVAL_ALPHAS="0 0.9" UNSEEN_ALPHAS=0.6 BASELINES="single:Qwen2.5-7B-Instruct oracle-hops"
#   PPO_ARGS="data.train_batch_size=8 actor.ppo_mini_batch_size=8 actor.ppo_micro_batch_size=8
#   critic.ppo_mini_batch_size=8 critic.ppo_micro_batch_size=8 critic.warmup_steps=0 data.val_batch_size=8"
#   MODEL='{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}' OUT=/tmp/alpha_smoke RESULTS=/tmp/alpha_smoke/results

mkdir -p "$OUT/logs" "$RESULTS"
start=$(date +%s)
stage() { echo "== [$(( $(date +%s) - start ))s] $*"; }
list() { echo "[$(echo $1 | tr ' ' ',')]"; }  # "0 0.3" -> [0,0.3] (hydra)
O=$OUT/oracle  # the conditioned oracle set: its tokenizer, model config and template serve every run
TEMPLATE=$O/prompt_template.txt

stage "1/5 data"
NAMES=(--rename "$RENAME")
[ "$WHOLE_NAMES" = 1 ] && NAMES+=(--whole-names)  # the tokenizer (the conditioned set's) serves every run
$PY -m sim.warm_start --out-dir "$O" --pool "$POOL" --n "$N_ORACLE" --alphas $ALPHAS --noise "$NOISE" \
  "${NAMES[@]}" ${MODEL:+--model "$MODEL"} --report | tee "$OUT/logs/oracle.txt"
FIXED_DATA=$ALPHAS
[ "$FIXED_SFT" = shared ] && FIXED_DATA=$(echo $ALPHAS | cut -d' ' -f1)
for a in $FIXED_DATA; do
  $PY -m sim.warm_start --out-dir "$OUT/oracle_fixed_$a" --pool "$POOL" --n "$N_ORACLE" --alphas "$a" \
    --no-alpha-text --noise "$NOISE" --rename "$RENAME" --prompt-template "$TEMPLATE" --no-tokenizer \
    > "$OUT/logs/oracle_fixed_$a.txt"
done
$PY -m sim.qa --out-dir "$OUT/data" --pool "$POOL" --prompt-template "$TEMPLATE" \
  --train-size "$TRAIN_SIZE" --val-size "$VAL_SIZE" --test-size "$TEST_SIZE"
# the same compact template listing every model of the pool, the unseen one too (the --include-unseen runs' prompts)
$PY -c 'import sys; from sim.embedded import render_compact_template; from router_r1.pool.registry import ModelRegistry
sys.stdout.write(render_compact_template(ModelRegistry.from_yaml(sys.argv[1])))' "$POOL" > "$OUT/prompt_template_unseen.txt"

sft() {  # train.sh's stage 3 on $1's oracle.parquet into $2, with the conditioned set's tokenizer and model config
  $PY -m verl.trainer.main_ppo --config-name sft "data.sft_files=[$1/oracle.parquet]" "model.path=$O/model.json" \
    "model.tokenizer=$O/tokenizer" "trainer.output_dir=$2" "trainer.hf_dir=$2" trainer.resume=none \
    trainer.total_epochs="$SFT_EPOCHS" trainer.total_steps="${SFT_MAX_STEPS:-null}" actor.lr=5e-3 \
    data.train_batch_size=16 actor.sft_context_loss_weight=1.0 "data.prompt_template=$TEMPLATE" > "$OUT/logs/$(basename "$2").log" 2>&1
}
stage "2/5 SFT: conditioned, then fixed ($FIXED_SFT)"
sft "$O" "$OUT/sft_cond"
sft_rows_key() {  # a digest of what SFT reads of $1's rows (prompts and segments): equal digests, the same model
  $PY -c 'import hashlib, json, sys, pandas as pd
rows = pd.read_parquet(sys.argv[1] + "/oracle.parquet")[["prompt", "segments"]].to_dict("records")
print(hashlib.sha1(json.dumps(rows, default=list).encode()).hexdigest())' "$1"
}
declare -A SFT_OF SFT_BY_KEY
for a in $FIXED_DATA; do
  k=$(sft_rows_key "$OUT/oracle_fixed_$a")
  if [ -n "${SFT_BY_KEY[$k]:-}" ]; then
    echo "fixed $a: its SFT rows are ${SFT_BY_KEY[$k]}'s, row for row; that SFT serves it" | tee -a "$OUT/logs/sft_shared.txt"
  else
    sft "$OUT/oracle_fixed_$a" "$OUT/sft_fixed_$a"
    SFT_BY_KEY[$k]=$OUT/sft_fixed_$a
  fi
  SFT_OF[$a]=${SFT_BY_KEY[$k]}
done
fixed_sft() { echo "${SFT_OF[$1]:-$OUT/sft_fixed_$FIXED_DATA}"; }  # shared: the one SFT

source tools/sim_pool.sh
start_sim_pool "$OUT/logs/pool_server.log" --pool "$POOL"
ppo() {  # $1 run name, $2 warm start, then overrides; the embedded default's PPO recipe for every run
  $PY -m verl.trainer.main_ppo --config-name embedded "data.train_files=[$OUT/data/train.parquet]" \
    "data.val_files=[$OUT/data/val.parquet]" "model.path=$2" "model.tokenizer=$2" "env.pool=$POOL" "env.pool_url=$URL" \
    "trainer.output_dir=$OUT/$1" trainer.resume=none trainer.total_steps="$PPO_STEPS" "data.prompt_template=$TEMPLATE" \
    trainer.experiment_name="$1" "${@:3}" $PPO_ARGS > "$OUT/logs/$1.log" 2>&1
}
stage "3/5 PPO: conditioned on $(list "$ALPHAS"), then fixed at each"
WHITEN=()
[ "$WHITEN_BY_ALPHA" = 1 ] && WHITEN=(algorithm.whiten_by=alpha)
ppo ppo_cond "$OUT/sft_cond" "env.alphas=$(list "$ALPHAS")" "${WHITEN[@]}"
for a in $ALPHAS; do ppo "ppo_fixed_$a" "$(fixed_sft "$a")" "env.alpha=$a"; done

stage "4/5 evaluation"
E=$OUT/eval
evaluate() {  # $1 output name, then flags
  $PY -m router_r1.eval.evaluate --data "$OUT/data/test.parquet" --pool "$POOL" --sim --greedy \
    ${EVAL_LIMIT:+--limit $EVAL_LIMIT} --out "$E/$1" "${@:2}" > "$OUT/logs/eval_$1.log" 2>&1
}
B=()
for b in $BASELINES; do B+=(--baseline "$b"); done
[ ${#B[@]} -gt 0 ] && evaluate baselines --alpha 0 "${B[@]}" --train-data "$OUT/data/train.parquet"
for a in $ALPHAS; do evaluate "fixed_$a" --checkpoint "$OUT/ppo_fixed_$a/hf"; done
for a in $EVAL_ALPHAS; do evaluate "cond_$a" --checkpoint "$OUT/ppo_cond/hf" --alpha "$a"; done
for a in $UNSEEN_ALPHAS; do
  [ -d "$E/cond_$a" ] || evaluate "cond_$a" --checkpoint "$OUT/ppo_cond/hf" --alpha "$a"
  evaluate "unseen_$a" --checkpoint "$OUT/ppo_cond/hf" --alpha "$a" --include-unseen \
    --prompt-template "$OUT/prompt_template_unseen.txt"
done

stage "5/5 tables, plot, paired comparisons, calibration"
SUMMARIES=()
for d in baselines $(for a in $ALPHAS; do echo "fixed_$a"; done) $(for a in $EVAL_ALPHAS; do echo "cond_$a"; done); do
  [ -f "$E/$d/summary.json" ] && SUMMARIES+=("$E/$d/summary.json")
done
$PY -m router_r1.eval.report "${SUMMARIES[@]}" --out "$RESULTS/pareto.png" > "$RESULTS/table.txt"
{
  echo "# the conditioned router told A minus the fixed-alpha router trained at A, on the same questions"
  for a in $ALPHAS; do
    [ -d "$E/cond_$a" ] || evaluate "cond_$a" --checkpoint "$OUT/ppo_cond/hf" --alpha "$a"
    $PY -m tools.analysis.paired_evals "$E/fixed_$a" "$E/cond_$a" --routers --out "$RESULTS/paired_cond_vs_fixed_$a.json"
  done
  if [ -n "$UNSEEN_ALPHAS" ]; then
    echo "# with the pool's unseen models offered (--include-unseen) minus without, the conditioned router told A"
  fi
  for a in $UNSEEN_ALPHAS; do
    $PY -m tools.analysis.paired_evals "$E/cond_$a" "$E/unseen_$a" --out "$RESULTS/paired_unseen_$a.json"
  done
} | tee "$RESULTS/paired.txt"
if [ -n "$CALIBRATE_TARGET" ]; then
  $PY -m router_r1.calibrate --checkpoint "$OUT/ppo_cond/hf" --data "$OUT/data/val.parquet" --pool "$POOL" --sim \
    --alphas $EVAL_ALPHAS --target-cost-per-1k "$CALIBRATE_TARGET" --out "$RESULTS" | tee "$RESULTS/calibrate.txt" \
    || [ $? = 1 ]  # exit 1: no alpha meets the target, a result (calibrate.txt says so), not a failed stage
fi
cp "$OUT/logs/oracle.txt" "$RESULTS/oracle_report.txt"
# training metrics and per-evaluation summaries kept gzipped, as docs/results holds them (tests/test_docs_budget.py)
for r in ppo_cond $(for a in $ALPHAS; do echo "ppo_fixed_$a"; done); do
  gzip -9nc "$OUT/$r/metrics.jsonl" > "$RESULTS/${r}_metrics.jsonl.gz"
done
for d in "$E"/*/; do gzip -9nc "$d/summary.json" > "$RESULTS/summary_$(basename "$d").json.gz"; done
stage "done: $RESULTS/table.txt, $RESULTS/pareto.png, $RESULTS/paired.txt"
