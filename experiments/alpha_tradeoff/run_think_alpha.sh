#!/usr/bin/env bash
# The conditioned router of the embedded default (2-layer policy from scratch, CPU) on SFT rows where every question
# comes at each alpha 0 / 0.3 / 0.6 / 0.9 and each decision's <think> restates "Cost weight A." just before the pick
# (sim.warm_start --alphas ... --each-alpha --think-alpha; on the H200 this made Gemma 3 270M's cost fall with the told alpha:
# experiments/gemma_alpha/run_gemma_alpha.sh), against four fixed-alpha SFTs with the same rows count, epochs and steps.
# Self-contained: run_alpha.sh's data flags and SFT recipe (6 epochs, 750 steps), greedy on the 300 test questions.
#
#   BASELINES_DIR=/tmp/base/eval/baselines bash experiments/alpha_tradeoff/run_think_alpha.sh
#       (BASELINES_DIR: an evaluation of the baselines on these test questions, summary.json and trajectories.jsonl;
#        empty: evaluated here with --baseline BASELINES)
# COND_FLAGS: more sim.warm_start flags for the conditioned router's rows only (think_alpha_4k: --n 4000, 1,000
#   questions at each alpha, which made the policy follow the told alpha); its rows then get their own tokenizer, while
#   the fixed runs keep the plain --think-alpha set's tokenizer and template, so they are the same runs as think_alpha's.
#   COND_EPOCHS: the conditioned SFT's epochs (default SFT_EPOCHS).
# REUSE_SFT=1: an SFT whose output directory under OUT already holds a model is kept, not trained again (the SFTs are
#   deterministic: a rerun with other COND_FLAGS keeps the fixed runs).
# SMOKE (a few minutes): N_ORACLE=64 TRAIN_SIZE=64 VAL_SIZE=8 TEST_SIZE=24 SFT_EPOCHS=1 SFT_MAX_STEPS=4
#   EVAL_ALPHAS="0 0.9" BASELINES="single:Qwen2.5-7B-Instruct oracle-hops"
#   MODEL='{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}' OUT=/tmp/think_smoke RESULTS=/tmp/think_smoke/results
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
OUT=${OUT:-outputs/think_alpha} RESULTS=${RESULTS:-docs/results/alpha_tradeoff/think_alpha}
POOL=configs/pool/sim_tradeoff.yaml ALPHAS="0 0.3 0.6 0.9"
EVAL_ALPHAS=${EVAL_ALPHAS:-0 0.15 0.3 0.45 0.6 0.7 0.8 0.9 1}  # the conditioned router is told each
N_ORACLE=${N_ORACLE:-2000} TRAIN_SIZE=${TRAIN_SIZE:-2000} VAL_SIZE=${VAL_SIZE:-100} TEST_SIZE=${TEST_SIZE:-300}
SFT_EPOCHS=${SFT_EPOCHS:-6} SFT_MAX_STEPS=${SFT_MAX_STEPS:-}
BASELINES_DIR=${BASELINES_DIR:-} BASELINES=${BASELINES:-all}
MODEL=${MODEL:-}                                     # JSON over the embedded policy's config (a smoke shrinks it)
COND_FLAGS=${COND_FLAGS:-} COND_EPOCHS=${COND_EPOCHS:-$SFT_EPOCHS} REUSE_SFT=${REUSE_SFT:-}
mkdir -p "$OUT/logs" "$RESULTS"
exec > >(tee "$RESULTS/run.txt") 2>&1
start=$(date +%s)
stage() { echo "== $(date -u +%T) [$(( $(date +%s) - start ))s] $*"; }
O=$OUT/oracle_cond TEMPLATE=$OUT/oracle_cond/prompt_template.txt E=$OUT/eval

stage "data: conditioned (--each-alpha --think-alpha; its tokenizer, model config and template serve every run${COND_FLAGS:+ but the conditioned one, on its own rows: $COND_FLAGS}), fixed at $ALPHAS, QA"
python -m sim.warm_start --out-dir "$O" --pool "$POOL" --n "$N_ORACLE" --alphas $ALPHAS --each-alpha \
  --think-alpha --noise 0.05 --rename 1 --whole-names ${MODEL:+--model "$MODEL"} --report > "$OUT/logs/oracle_cond.txt"
C=$O  # the conditioned router's rows
if [ -n "$COND_FLAGS" ]; then
  C=$OUT/oracle_cond_flags
  python -m sim.warm_start --out-dir "$C" --pool "$POOL" --n "$N_ORACLE" --alphas $ALPHAS --each-alpha \
    --think-alpha $COND_FLAGS --noise 0.05 --rename 1 --whole-names ${MODEL:+--model "$MODEL"} --report > "$OUT/logs/oracle_cond_flags.txt"
fi
for a in $ALPHAS; do
  python -m sim.warm_start --out-dir "$OUT/oracle_fixed_$a" --pool "$POOL" --n "$N_ORACLE" --alphas "$a" \
    --no-alpha-text --noise 0.05 --rename 1 --prompt-template "$TEMPLATE" --no-tokenizer > "$OUT/logs/oracle_fixed_$a.txt"
done
python -m sim.qa --out-dir "$OUT/data" --pool "$POOL" --prompt-template "$TEMPLATE" \
  --train-size "$TRAIN_SIZE" --val-size "$VAL_SIZE" --test-size "$TEST_SIZE" > "$OUT/logs/qa.txt"

sft() {  # run_alpha.sh's sft(): $1's oracle.parquet into $2, with the tokenizer, model config and template of
  # ${3:-the plain conditioned set}, for ${4:-SFT_EPOCHS} epochs
  local T=${3:-$O}
  if [ -n "$REUSE_SFT" ] && [ -f "$2/model.safetensors" ]; then stage "SFT $(basename "$2"): reused (REUSE_SFT)"; return; fi
  python -m verl.trainer.main_ppo --config-name sft "data.sft_files=[$1/oracle.parquet]" "model.path=$T/model.json" \
    "model.tokenizer=$T/tokenizer" "trainer.output_dir=$2" "trainer.hf_dir=$2" trainer.resume=none \
    trainer.total_epochs="${4:-$SFT_EPOCHS}" trainer.total_steps="${SFT_MAX_STEPS:-null}" actor.lr=5e-3 \
    data.train_batch_size=16 actor.sft_context_loss_weight=1.0 "data.prompt_template=$T/prompt_template.txt" > "$OUT/logs/$(basename "$2").log" 2>&1
  stage "SFT $(basename "$2") done: $(tail -1 "$OUT/logs/$(basename "$2").log")"
}
stage "SFTs: conditioned${COND_FLAGS:+ ($COND_FLAGS, $COND_EPOCHS epochs)}, then fixed at $ALPHAS"
sft "$C" "$OUT/sft_cond" "$C" "$COND_EPOCHS"
for a in $ALPHAS; do sft "$OUT/oracle_fixed_$a" "$OUT/sft_fixed_$a"; done
# an SFT run's config has env: null; with the embedded recipe's env and env.alphas, evaluation tells it its alpha
python -m experiments.alpha_tradeoff.conditioned_env "$OUT/sft_cond/run_config.yaml" "$POOL" $ALPHAS

evaluate() {  # $1 output name, then flags (run_alpha.sh's evaluate())
  python -m router_r1.eval.evaluate --data "$OUT/data/test.parquet" --pool "$POOL" --sim --greedy --out "$E/$1" "${@:2}" \
    > "$OUT/logs/eval_$1.log" 2>&1
  stage "eval $1: $(grep -o 'EM [0-9.]*, pool calls [0-9]*' "$OUT/logs/eval_$1.log" | head -1)"
}
stage "evaluation: fixed_A at A, the conditioned told each of $EVAL_ALPHAS, the baselines"
for a in $ALPHAS; do evaluate "fixed_$a" --checkpoint "$OUT/sft_fixed_$a" --alpha "$a"; done
for a in $EVAL_ALPHAS; do evaluate "cond_$a" --checkpoint "$OUT/sft_cond" --alpha "$a"; done
if [ -z "$BASELINES_DIR" ]; then
  B=(); for b in $BASELINES; do B+=(--baseline "$b"); done
  evaluate baselines --alpha 0 "${B[@]}" --train-data "$OUT/data/train.parquet"
  BASELINES_DIR=$E/baselines
fi

stage "paired tables, report"
{
  for a in $ALPHAS; do
    [ -d "$E/cond_$a" ] || continue
    echo "# the conditioned router told $a minus the fixed-alpha SFT at $a (same rows count, epochs, steps)"
    python -m tools.analysis.paired_evals "$E/fixed_$a" "$E/cond_$a" --routers --out "$RESULTS/paired_cond_vs_fixed_$a.json"
  done
  for a in $EVAL_ALPHAS; do
    [ "$a" = 0 ] && continue
    echo "# the conditioned router told $a minus told 0"
    python -m tools.analysis.paired_evals "$E/cond_0" "$E/cond_$a" --routers --out "$RESULTS/paired_cond_${a}_vs_cond_0.json"
  done
} > "$RESULTS/paired.txt"
S=("$BASELINES_DIR/summary.json")
for a in $ALPHAS; do S+=("$E/fixed_$a/summary.json"); done
for a in $EVAL_ALPHAS; do S+=("$E/cond_$a/summary.json"); done
python -m router_r1.eval.report "${S[@]}" --out "$RESULTS/pareto.png" > "$RESULTS/table.txt"
cp "$OUT/logs/$(basename "$C").txt" "$RESULTS/oracle_report.txt"  # the conditioned rows' report
gzip -9c "$BASELINES_DIR/summary.json" > "$RESULTS/summary_baselines.json.gz"
for d in "$E"/*/; do gzip -9c "$d/summary.json" > "$RESULTS/summary_$(basename "$d").json.gz"; done
stage "done: $RESULTS/table.txt, $RESULTS/pareto.png, $RESULTS/paired.txt"
