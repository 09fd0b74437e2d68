#!/usr/bin/env bash
# Issue 31's unseen model on the embedded default (CPU): SFT on rows whose <think> states the listed lines and whose
# fallback after no answer is the next cheapest listed line (sim.warm_start --think-candidates --fallback listed
# --fallback-drill, as docs/results/h200/gemma_unseen/fallback on Gemma), then the 300 test questions with and
# without SciGLM-6B offered, paired. SciGLM-6B's name token gets a row drawn like the routed names'
# (tools/analysis/new_model_names.py) before it is offered.
#   bash experiments/unseen_model/run_fallback_cpu.sh [RUN]      # RUN default outputs/unseen/fallback_cpu
# N, EPOCHS, RIVAL, BANK override the rows, epochs, rival share and name bank; RIVAL_CHEAPER the share of rival lines
# that undercut the pick (--rival-cheaper), BANK_STYLES=1 gives the bank real model names' shapes (--bank-styles).
set -euo pipefail
RUN=${1:-outputs/unseen/fallback_cpu} POOL=configs/pool/sim_unseen.yaml
N=${N:-3000} EPOCHS=${EPOCHS:-5} RIVAL=${RIVAL:-0.8} BANK=${BANK:-1000} RIVAL_CHEAPER=${RIVAL_CHEAPER:-0.7}
STYLE_FLAG=(); [ "${BANK_STYLES:-0}" = 1 ] && STYLE_FLAG=(--bank-styles)
start=$(date +%s)
stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }
stage "oracle rows ($N, add-rival $RIVAL, bank $BANK ${STYLE_FLAG[*]}, rival-cheaper $RIVAL_CHEAPER, think-candidates," \
  "fallback listed, drill 0.1)"
python -m sim.warm_start --out-dir "$RUN/oracle" --pool "$POOL" --n "$N" --noise 0.05 --rename 1 \
  --whole-names --add-rival "$RIVAL" --bank-size "$BANK" --think-candidates --fallback listed --fallback-drill 0.1 \
  --rival-cheaper "$RIVAL_CHEAPER" "${STYLE_FLAG[@]}" --report
python -m sim.qa --out-dir "$RUN/data" --prompt-template "$RUN/oracle/prompt_template.txt" \
  --train-size 10 --val-size 10 --test-size 300
python -c 'import sys; from sim.embedded import render_compact_template; from router_r1.pool.registry import ModelRegistry
sys.stdout.write(render_compact_template(ModelRegistry.from_yaml(sys.argv[1])))' "$POOL" > "$RUN/prompt_template_unseen.txt"
python -m sim.qa --out-dir "$RUN/data_unseen" --prompt-template "$RUN/prompt_template_unseen.txt" \
  --train-size 10 --val-size 10 --test-size 300
stage "supervised warm start (train.sh stage 3's settings: lr 5e-3, batch 16, context loss 1.0)"
python -m verl.trainer.sft --data "$RUN/oracle/oracle.parquet" --model "$RUN/oracle/model.json" \
  --tokenizer "$RUN/oracle/tokenizer" --out "$RUN/sft" --epochs "$EPOCHS" --lr 5e-3 --batch-size 16 \
  --context-loss-weight 1.0 --device cpu --prompt-template "$RUN/oracle/prompt_template.txt"
python -m tools.analysis.new_model_names --checkpoint "$RUN/sft" --like "$RUN/oracle/oracle.parquet" --names SciGLM-6B \
  --out "$RUN/sft_new"
stage "evaluation: the seen listing, then SciGLM-6B offered"
ev() { python -m router_r1.eval.evaluate --pool "$POOL" --sim --greedy --alpha 0 --device cpu --max-turns 3 \
  --checkpoint "$RUN/sft_new" "$@"; }
ev --data "$RUN/data/test.parquet" --out "$RUN/eval_seen"
ev --data "$RUN/data_unseen/test.parquet" --include-unseen --prompt-template "$RUN/prompt_template_unseen.txt" \
  --out "$RUN/eval_unseen"
python -m tools.analysis.paired_evals "$RUN/eval_seen" "$RUN/eval_unseen" --out "$RUN/paired_unseen.json"
stage done
