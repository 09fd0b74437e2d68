#!/usr/bin/env bash
# Issue 31's unseen model with the pretrained Gemma 3 270M (device tool; the bundle as for run_gemma.sh: the
# calls before this one leave .gg/b0 ... in $PIECES, this one carries the last piece). SFT on oracle rows of
# which VARY share list a pool of their own (sim.warm_start --vary-pool: random models, made-up names, prices; the
# pick is the cheapest listed model naming the domain), then the 300 test questions twice, paired: the seen
# pool's listing, and the listing with SciGLM-6B ($0.05, science; never in a training row) under
# --include-unseen. VARY=0 is the same SFT on the fixed listing (pipeline_gemma_s8's warm start). RIVAL share of
# rows list the pool's own listing plus one made-up line (sim.warm_start --add-rival: cheaper than the pick for its
# domains 70% of the time, else dearer), so the familiar listing is itself a case of the cheapest-line rule.
# THINK=1 makes each oracle-mode hop's <think> state the listed lines naming its domain with their prices before
# the pick (sim.warm_start --think-candidates), so the pick is a copy from a few tokens back; its turns run to 89 Gemma
# tokens (60 without), so the evaluation's per-turn --response-length goes from 64 to 128 (RESPONSE_LENGTH).
# FALLBACK=listed (with THINK=1) makes a hop whose reply has no answer ask the cheapest other listed line naming its
# domain, stating those lines (sim.warm_start --fallback listed), and DRILL share of oracle rows show that fallback
# after a cheaper rival line's miss (--fallback-drill). SEED: the oracle's question draw and noise. BANK: the made-up
# names the rival lines draw from (--bank-size); BANK_STYLES=1 gives them real model names' shapes (--bank-styles);
# RIVAL_CHEAPER: the share of rival lines that undercut the pick (--rival-cheaper). EVAL_BATCH: the evaluation's
# batch (several runs share one GPU). PROBE=1 adds the validation probe: 300 validation questions with and without
# GeoMind-3B (configs/pool/sim_probe.yaml: another new model, on geography) offered, paired (paired_probe.json), so
# a draw can be chosen by its share of geography calls to GeoMind-3B without looking at the test. MISNAME: the share
# of oracle rows whose first route misspells its pick, reads the invalid-action hint and routes again
# (--misname-drill); with it every evaluation runs with --invalid-hint, both sides of each pair alike. CONSTRAIN=1
# evaluates the offered listings (test, and the probe's with PROBE=1) once more with each route's model name held
# to the listed names (--constrain-names, on the hf engine), paired against the free-decoding ones
# (paired_constrained.json, paired_probe_constrained.json). HF_FREE=1 evaluates the offered test listing on the hf
# engine without the constraint too (paired_hf.json against hf_static): what the engine changes, apart from the constraint.
# NEW_POOL=1 evaluates the test questions once more against a user's own pool (configs/pool/sim_new_names.yaml: four
# names no row lists, domain pairs the training pool lacks), beside each of its models alone and the oracle (eval_new).
#   THINK=1 RIVAL=0.8 VARY=0 FALLBACK=listed DRILL=0.1 BANK=1000 bash experiments/gemma_unseen/run_gemma_unseen.sh DIR
#   THINK=1 RIVAL=0.5 VARY=0 bash experiments/gemma_unseen/run_gemma_unseen.sh DIR
#   bash experiments/gemma_unseen/run_gemma_unseen.sh DIR   # DIR: unseen_run.tgz, run.txt
# A CPU smoke of the wiring: MODEL='{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
#   "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}' DEVICE=cpu N_ORACLE=32 TEST_SIZE=8 \
#   RUN=/tmp/smoke TOKENIZER=/tmp/smoke/oracle/tokenizer ...   (the oracle's BPE: Gemma's 262k vocabulary runs a
#   23 GB CPU box out of memory in the SFT)
set -uo pipefail
RESULTS=${1:?where the results go}
mkdir -p "$RESULTS"
source "$(dirname "$0")/../gemma_h200/gemma_bundle.sh"  # GGUF, TOKENIZER, the wheels on PYTHONPATH
RUN=${RUN:-/tmp/gemma_unseen} POOL=configs/pool/sim_unseen.yaml VARY=${VARY:-0.5} RIVAL=${RIVAL:-0}
MODEL=${MODEL:-$GGUF} DEVICE=${DEVICE:-cuda} TEST_SIZE=${TEST_SIZE:-300} THINK=${THINK:-0}
THINK_FLAG=(); [ "$THINK" = 1 ] && THINK_FLAG=(--think-candidates)
FALLBACK=${FALLBACK:-best} DRILL=${DRILL:-0} SEED=${SEED:-0} BANK=${BANK:-96} EVAL_BATCH=${EVAL_BATCH:-256}
PROBE=${PROBE:-0} PROBE_POOL=configs/pool/sim_probe.yaml
RIVAL_CHEAPER=${RIVAL_CHEAPER:-0.7} STYLE_FLAG=(); [ "${BANK_STYLES:-0}" = 1 ] && STYLE_FLAG=(--bank-styles)
MISNAME=${MISNAME:-0} HINT_FLAG=(); [ "$MISNAME" != 0 ] && HINT_FLAG=(--invalid-hint)
CONSTRAIN=${CONSTRAIN:-0} HF_FREE=${HF_FREE:-0} NEW_POOL=${NEW_POOL:-0} NEW=configs/pool/sim_new_names.yaml
RESPONSE_LENGTH=${RESPONSE_LENGTH:-$([ "$THINK" = 1 ] && echo 128 || echo 64)}
export TOKENIZERS_PARALLELISM=false
# the compact template listing every model of a pool yaml, the unseen ones too
compact_template() { python3 -c 'import sys; from sim.embedded import render_compact_template
from router_r1.pool.registry import ModelRegistry
sys.stdout.write(render_compact_template(ModelRegistry.from_yaml(sys.argv[1])))' "$1"; }
(
  set -e
  start=$(date +%s)
  stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }
  stage "oracle rows (vary-pool $VARY, add-rival $RIVAL, think-candidates $THINK, fallback $FALLBACK, drill $DRILL," \
    "seed $SEED, bank $BANK ${STYLE_FLAG[*]}, rival-cheaper $RIVAL_CHEAPER, misname-drill $MISNAME), test data with and" \
    "without SciGLM-6B listed"
  # the oracle's pool holds SciGLM-6B so that no row's made-up names take it; its rows list seen models only
  python3 -m sim.warm_start --out-dir "$RUN/oracle" --n "${N_ORACLE:-2000}" --noise 0.05 --rename 1 \
    --vary-pool "$VARY" --add-rival "$RIVAL" "${THINK_FLAG[@]}" --fallback "$FALLBACK" --fallback-drill "$DRILL" \
    --seed "$SEED" --bank-size "$BANK" "${STYLE_FLAG[@]}" --rival-cheaper "$RIVAL_CHEAPER" --misname-drill "$MISNAME" \
    --pool "$POOL" --report
  python3 -m sim.qa --out-dir "$RUN/data" --prompt-template "$RUN/oracle/prompt_template.txt" \
    --train-size 10 --val-size 10 --test-size "$TEST_SIZE"
  compact_template "$POOL" > "$RUN/prompt_template_unseen.txt"
  python3 -m sim.qa --out-dir "$RUN/data_unseen" --prompt-template "$RUN/prompt_template_unseen.txt" \
    --train-size 10 --val-size 10 --test-size "$TEST_SIZE"
  stage "supervised warm start (pipeline_gemma_s8's settings)"
  python3 -m verl.trainer.sft --data "$RUN/oracle/oracle.parquet" --model "$MODEL" --tokenizer "$TOKENIZER" \
    --out "$RUN/sft" --epochs 3 --lr 1e-4 --batch-size 16 --context-loss-weight 0 --device "$DEVICE" \
    --time-limit-s "${SFT_TIME_LIMIT:-260}" --prompt-template "$RUN/oracle/prompt_template.txt"
  stage "evaluation: the seen listing, then SciGLM-6B offered"
  # turns and lengths: the PPO runs' of pipeline_gemma_s8 (an SFT checkpoint's run config has none of its own)
  ev() { python3 -m router_r1.eval.evaluate --pool "$POOL" --sim --greedy --alpha 0 --device "$DEVICE" --rollout hf_static \
    --batch-size "$EVAL_BATCH" --max-turns 3 --max-obs-length 128 --response-length "$RESPONSE_LENGTH" --max-response-length 512 \
    --checkpoint "$RUN/sft" "${HINT_FLAG[@]}" "$@"; }
  # the test with SciGLM-6B offered, and the probe's validation questions with GeoMind-3B offered
  offered() { ev --data "$RUN/data_unseen/test.parquet" --include-unseen \
    --prompt-template "$RUN/prompt_template_unseen.txt" "$@"; }
  probed() { ev --data "$RUN/data_probe/val.parquet" --pool "$PROBE_POOL" --include-unseen \
    --prompt-template "$RUN/prompt_template_probe.txt" "$@"; }
  if [ "$NEW_POOL" = 1 ]; then  # first: a call cut by its time limit keeps it
    stage "a pool of four new names ($NEW): the router beside each model alone and the oracle"
    compact_template "$NEW" > "$RUN/prompt_template_new.txt"
    python3 -m sim.qa --out-dir "$RUN/data_new" --prompt-template "$RUN/prompt_template_new.txt" \
      --train-size 10 --val-size 10 --test-size "$TEST_SIZE"
    ev --data "$RUN/data_new/test.parquet" --pool "$NEW" --allow-unseen-models \
      --prompt-template "$RUN/prompt_template_new.txt" --baseline all-singles --baseline oracle-hops --out "$RUN/eval_new"
  fi
  ev --data "$RUN/data/test.parquet" --out "$RUN/eval_seen"
  offered --out "$RUN/eval_unseen"
  python3 -m tools.analysis.paired_evals "$RUN/eval_seen" "$RUN/eval_unseen" --out "$RUN/paired_unseen.json"
  if [ "$PROBE" = 1 ]; then
    stage "validation probe: GeoMind-3B offered on $TEST_SIZE validation questions, paired against the seen listing"
    compact_template "$PROBE_POOL" > "$RUN/prompt_template_probe.txt"
    # the same test size as above: validation questions never repeat a test question's facts
    for d in data_val:"$RUN/oracle/prompt_template.txt" data_probe:"$RUN/prompt_template_probe.txt"; do
      python3 -m sim.qa --out-dir "$RUN/${d%%:*}" --prompt-template "${d#*:}" --train-size 10 \
        --val-size "$TEST_SIZE" --test-size "$TEST_SIZE"
    done
    ev --data "$RUN/data_val/val.parquet" --pool "$PROBE_POOL" --out "$RUN/eval_val_seen"
    probed --out "$RUN/eval_probe"
    python3 -m tools.analysis.paired_evals "$RUN/eval_val_seen" "$RUN/eval_probe" --out "$RUN/paired_probe.json"
  fi
  # last, on the slower hf engine: a run cut by its time limit still has the free-decoding pairs above
  if [ "$HF_FREE" = 1 ]; then
    stage "SciGLM-6B offered, on the hf engine without the constraint"
    offered --rollout hf --out "$RUN/eval_unseen_hf"
    python3 -m tools.analysis.paired_evals "$RUN/eval_unseen" "$RUN/eval_unseen_hf" --out "$RUN/paired_hf.json"
  fi
  if [ "$CONSTRAIN" = 1 ] && [ "$PROBE" = 1 ]; then  # the probe first: its new name is the one misspelt
    stage "GeoMind-3B offered, route names constrained to the listed ones"
    probed --rollout hf --constrain-names --out "$RUN/eval_probe_constrained"
    python3 -m tools.analysis.paired_evals "$RUN/eval_probe" "$RUN/eval_probe_constrained" \
      --out "$RUN/paired_probe_constrained.json"
  fi
  if [ "$CONSTRAIN" = 1 ]; then
    stage "SciGLM-6B offered, route names constrained to the listed ones"
    offered --rollout hf --constrain-names --out "$RUN/eval_unseen_constrained"
    python3 -m tools.analysis.paired_evals "$RUN/eval_unseen" "$RUN/eval_unseen_constrained" --out "$RUN/paired_constrained.json"
  fi
  stage done
) > "$RESULTS/run.txt" 2>&1
echo "rc $?" >> "$RESULTS/run.txt"
(cd "$RUN" && find . -type f ! -name '*.safetensors' ! -name '*.pt' ! -name '*.parquet' ! -name 'tokenizer*' \
   -size -4M | tar czf "$RESULTS/unseen_run.tgz" -T -)
tail -30 "$RESULTS/run.txt"
