#!/usr/bin/env bash
# Issue 31's one router for every cost weight, with the pretrained Gemma 3 270M on configs/pool/sim_tradeoff.yaml
# (device tool; the bundle as for run_gemma.sh: the calls before this one leave .gg/b0 ... in $PIECES, this one
# carries the last piece). SFTs with the same budget (2,000 oracle rows, pipeline_gemma_s8's recipe: 3 epochs,
# lr 1e-4, policy tokens only), run side by side on the one GPU (each alone leaves it mostly idle):
#   cond_think  conditioned: 500 questions, each at all four alphas 0 / 0.3 / 0.6 / 0.9 stated in its prompt, and each
#               decision's <think> restating it (sim.warm_start --alphas ... --each-alpha --think-alpha)
#   cond_each   the same rows without the restatement (--each-alpha)
#   cond        each row's alpha drawn from the four (the CPU runs' data)
#   fixed_A     one per alpha A, plain prompts, routes planned at A
#   NAME_xK     a conditioned run NAME on K times the rows (K x N_ORACLE; e.g. cond_think_x2)
# CONDS picks the conditioned runs (default cond_think cond_each), FIXED the fixed ones (default all four; empty: none,
# to pair against an earlier run's); then greedy on the 300 test questions of docs/results/alpha_tradeoff (the same
# sim.qa draw): fixed_A scored at A, each conditioned run told each of EVAL_ALPHAS; paired tables of told A against
# fixed_A. The last stage calibrates the first of CONDS on the 100 validation questions (router_r1.calibrate, cost
# target CALIBRATE_COST per 1,000 questions) and serves it, asking the same questions as router-r1@A for each trained A.
# STAGES runs a subset of "data sft eval serve" (a device call lasts at most 600 s: SFTs in one call, the rest in the
# next, to a warm machine whose /tmp still holds RUN).
#   bash experiments/gemma_alpha/run_gemma_alpha.sh DIR   # DIR: alpha_run.tgz (evaluations, SFT summaries), run.txt
#   CONDS="cond_think cond_think_x2" COND_ALPHAS="0 0.3 0.6 0.9 1" FIXED= STAGES="data sft" bash ... DIR
# A CPU smoke of the wiring (no bundle; the embedded tokenizer the conditioned set builds):
#   MODEL='{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
#   "num_attention_heads": 2, "num_key_value_heads": 1}' DEVICE=cpu N_ORACLE=32 TEST_SIZE=8 EVAL_ALPHAS="0 0.9" ...
set -uo pipefail
RESULTS=${1:?where the results go}
mkdir -p "$RESULTS"
if [ -z "${MODEL:-}" ]; then
  source "$(dirname "$0")/../gemma_h200/gemma_bundle.sh"  # GGUF, TOKENIZER, the wheels on PYTHONPATH
  MODEL=$GGUF
fi
RUN=${RUN:-/tmp/gemma_alpha} POOL=configs/pool/sim_tradeoff.yaml DEVICE=${DEVICE:-cuda}
N_ORACLE=${N_ORACLE:-2000} TEST_SIZE=${TEST_SIZE:-300} ALPHAS="0 0.3 0.6 0.9"  # one fixed run each
# the conditioned runs' training alphas (cond_each, cond_think; N_ORACLE a multiple of their count): told 1 outside
# the trained range, cond_think routed like told 0 (docs/results/h200/gemma_alpha), try COND_ALPHAS="0 0.3 0.6 0.9 1"
COND_ALPHAS=${COND_ALPHAS:-$ALPHAS}
CONDS=${CONDS:-cond_think cond_each}
COND_SEED=${COND_SEED:-0}  # the conditioned rows' question, alpha and noise draw (a replicate: another seed)
FIXED=${FIXED-$ALPHAS} STAGES=${STAGES:-data sft eval serve} CALIBRATE_COST=${CALIBRATE_COST:-0.005}
EVAL_ALPHAS=${EVAL_ALPHAS:-0 0.15 0.3 0.45 0.6 0.7 0.8 0.9 1}  # each of CONDS is told each
# An SFT's peak is 25-40 GB (Gemma's 262k-word logits), an evaluation of 256 prompts about 40 GB (not traced):
# six SFTs or six such evaluations at once ran out of the H200's 140 GB
SFT_PARALLEL=${SFT_PARALLEL:-3} EVAL_PARALLEL=${EVAL_PARALLEL:-4} EVAL_BATCH=${EVAL_BATCH:-128}
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2
has() { [[ " $STAGES " == *" $1 "* ]]; }
# the episode's turns and lengths for evaluation, calibration and serving: pipeline_gemma_s8's PPO runs' (as
# run_gemma_unseen.sh; an SFT checkpoint's run config has none of its own)
SHAPE=(--max-turns 3 --max-obs-length 128 --response-length 64 --max-response-length 512)
(
  set -e
  start=$(date +%s)
  stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }
  O=$RUN/oracle_cond TEMPLATE=$RUN/oracle_cond/prompt_template.txt
  # the embedded tokenizer is built only for a CPU smoke (Gemma brings its own)
  TOK=(--no-tokenizer)
  [ -n "${TOKENIZER:-}" ] || TOK=()
  TOKENIZER=${TOKENIZER:-$O/tokenizer}
  RUNS=$CONDS
  for a in $FIXED; do RUNS+=" fixed_$a"; done  # (printf over an empty FIXED would make a run "fixed_")
  if has data; then
  stage "oracle rows: cond (the template), $CONDS, fixed at ${FIXED:-(none)}; the test questions"
  python3 -m sim.warm_start --out-dir "$O" --pool "$POOL" --n "$N_ORACLE" --alphas $ALPHAS \
    --noise 0.05 --rename 1 "${TOK[@]}" --report
  for r in $CONDS; do
    flags=(--each-alpha) k=1
    [[ $r == *_x* ]] && k=${r##*_x}
    [[ $r == cond_think* ]] && flags+=(--think-alpha)
    [[ $r == cond_each* || $r == cond_think* ]] || flags=()  # cond: each row's alpha drawn from the set
    python3 -m sim.warm_start --out-dir "$RUN/oracle_$r" --pool "$POOL" --n $((N_ORACLE * k)) \
      --alphas $COND_ALPHAS "${flags[@]}" --noise 0.05 --rename 1 --seed "$COND_SEED" --prompt-template "$TEMPLATE" \
      --no-tokenizer &
  done
  for a in $FIXED; do
    python3 -m sim.warm_start --out-dir "$RUN/oracle_fixed_$a" --pool "$POOL" --n "$N_ORACLE" \
      --alphas "$a" --no-alpha-text --noise 0.05 --rename 1 --prompt-template "$TEMPLATE" --no-tokenizer &
  done
  # run_alpha.sh's sizes, so the test questions are docs/results/alpha_tradeoff's (its baselines' summary)
  python3 -m sim.qa --out-dir "$RUN/data" --pool "$POOL" --prompt-template "$TEMPLATE" \
    --train-size 2000 --val-size 100 --test-size "$TEST_SIZE" &
  wait
  fi
  if has sft; then
  stage "SFTs, $SFT_PARALLEL side by side: $RUNS"
  for r in $RUNS; do
    while [ "$(jobs -rp | wc -l)" -ge "$SFT_PARALLEL" ]; do sleep 1; done
    python3 -m verl.trainer.sft --data "$RUN/oracle_$r/oracle.parquet" --model "$MODEL" --tokenizer "$TOKENIZER" \
      --out "$RUN/sft_$r" --epochs 3 --lr 1e-4 --batch-size 16 --context-loss-weight 0 --device "$DEVICE" \
      --time-limit-s "${SFT_TIME_LIMIT:-300}" --prompt-template "$TEMPLATE" > "$RUN/sft_$r.log" 2>&1 &
  done
  wait
  for r in $RUNS; do echo "$r: $(tail -1 "$RUN/sft_$r.log")"; done
  # An SFT run's config has no env section; a conditioned router is told its alpha at evaluation when its run
  # config has env.alphas (evaluate.conditioned_alpha): give each the embedded recipe's env with COND_ALPHAS.
  for r in $CONDS; do
    python3 -m experiments.alpha_tradeoff.conditioned_env "$RUN/sft_$r/run_config.yaml" "$POOL" $COND_ALPHAS
  done
  fi
  FIRST=${CONDS%% *}
  if has eval; then
  stage "evaluation, $EVAL_PARALLEL at a time: fixed_A at A; $CONDS told each of $EVAL_ALPHAS"
  ev() { python3 -m router_r1.eval.evaluate --data "$RUN/data/test.parquet" --pool "$POOL" --sim --greedy \
    --device "$DEVICE" --rollout "${ROLLOUT:-hf_static}" --batch-size "$EVAL_BATCH" "${SHAPE[@]}" \
    --checkpoint "$RUN/sft_$1" --alpha "$2" \
    --out "$RUN/eval/$1_$2" > "$RUN/eval_$1_$2.log" 2>&1 || echo "eval $1 at $2 failed (rc $?)"; }
  jobs=()
  for a in $FIXED; do jobs+=("fixed_$a $a"); done
  for r in $CONDS; do for a in $EVAL_ALPHAS; do jobs+=("$r $a"); done; done
  for j in "${jobs[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$EVAL_PARALLEL" ]; do sleep 1; done
    ev $j &
  done
  wait
  for j in "${jobs[@]}"; do set -- $j; echo "$1 told $2: $(grep -o 'EM [0-9.]*, pool calls [0-9]*' "$RUN/eval_$1_$2.log")"; done
  stage "paired: conditioned told A minus fixed_A"
  for r in $CONDS; do
    for a in $FIXED; do
      [ -d "$RUN/eval/${r}_$a" ] || continue  # not among EVAL_ALPHAS
      echo "# $r told $a minus fixed_$a"
      python3 -m tools.analysis.paired_evals "$RUN/eval/fixed_${a}_$a" "$RUN/eval/${r}_$a" --routers
    done
  done | tee "$RUN/paired_vs_fixed.txt"
  fi
  if has serve; then
  stage "$FIRST: the alpha for a cost of $CALIBRATE_COST USD per 1,000 questions on validation; served at $COND_ALPHAS"
  python3 -m router_r1.calibrate --checkpoint "$RUN/sft_$FIRST" --data "$RUN/data/val.parquet" --pool "$POOL" --sim \
    --device "$DEVICE" --batch-size "$EVAL_BATCH" --alphas $COND_ALPHAS --target-cost-per-1k "$CALIBRATE_COST" \
    "${SHAPE[@]}" --out "$RUN/calibrate" \
    || echo "calibrate rc $?"
  PORT=${PORT:-18080}
  python3 -m router_r1.serve --checkpoint "$RUN/sft_$FIRST" --pool "$POOL" --sim --sim-latency 0 --device "$DEVICE" \
    --port "$PORT" "${SHAPE[@]}" \
    > "$RUN/serve.log" 2>&1 &
  SERVER=$!
  python3 -m experiments.gemma_alpha.serve_alpha_demo --url "http://127.0.0.1:$PORT/v1" --data "$RUN/data/test.parquet" \
    --alphas $COND_ALPHAS --n "${SERVE_N:-60}" --out "$RUN/serve_demo.json" || echo "serve demo rc $?"
  kill $SERVER || true  # (a server that died already must not fail the run)
  fi
  stage done
) > "$RESULTS/run.txt" 2>&1
echo "rc $?" >> "$RESULTS/run.txt"
(cd "$RUN" && find . -type f ! -name '*.safetensors' ! -name '*.pt' ! -name '*.parquet' ! -name 'tokenizer*' \
   ! -path './oracle_*/tokenizer/*' -size -4M | tar czf "$RESULTS/alpha_run.tgz" -T -)
tail -40 "$RESULTS/run.txt"
