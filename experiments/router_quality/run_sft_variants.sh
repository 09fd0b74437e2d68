#!/usr/bin/env bash
# Which warm start copies and routes well enough for the router to beat single models (issue 32)?
# Each variant builds the embedded default's oracle data, tokenizer and model, trains SFT on CPU with
# 2 threads (as on the 2-core machine), and evaluates the SFT model greedily on the 300 test questions
# with the simulated pool in-process. The variants run side by side, 2 threads each (a 16-core host).
#
#   VARIANTS="base clean clean_syll" bash experiments/router_quality/run_sft_variants.sh
#
# Results: $BACK/summary.txt (each variant's data report and evaluation table), $BACK/runs.tgz (logs,
# summaries, trajectories; no weights).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
W=${WORK:-/tmp/variants}
BACK=${BACK:-outputs/variants}
mkdir -p "$W" "$BACK"
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${THREADS:-2} MKL_NUM_THREADS=${THREADS:-2} PYTHONUNBUFFERED=1
NOISY="--noise 0.2 --prefer-big 0.3 --confuse 0.8"   # train.sh's annotator today
CLEAN="--noise 0.05"                                 # routes each hop to its domain's cheap specialist
BIG='{"hidden_size": 192, "intermediate_size": 576, "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 6}'

flags() {  # variant -> "oracle flags|SFT epochs|model json"
  case $1 in
    base)        echo "$NOISY|6|" ;;
    clean)       echo "$CLEAN|6|" ;;
    clean_syll)  echo "$CLEAN --no-name-tokens|6|" ;;
    clean_big)   echo "$CLEAN|6|$BIG" ;;
    syll_big)    echo "$CLEAN --no-name-tokens|6|$BIG" ;;
    clean_long)  echo "$CLEAN|12|" ;;
    syll_long)   echo "$CLEAN --no-name-tokens|12|" ;;
    noisy_syll)  echo "$NOISY --no-name-tokens|6|" ;;
    clean_freeze) echo "$CLEAN --freeze-names|6|" ;;
    freeze_long) echo "$CLEAN --freeze-names|12|" ;;
    noisy_freeze) echo "$NOISY --freeze-names|6|" ;;
    rename_half) echo "$CLEAN --rename 0.5|6|" ;;
    rename_all)  echo "$CLEAN --rename 1|6|" ;;
    whole)       echo "$CLEAN --whole-names|6|" ;;
    whole_half)  echo "$CLEAN --whole-names --rename 0.5|6|" ;;
    whole_rename) echo "$CLEAN --whole-names --rename 1|6|" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

one() {
  local v=$1 out=$W/$1 f oracle epochs model
  f=$(flags "$v"); oracle=${f%%|*}; f=${f#*|}; epochs=${f%%|*}; model=${f#*|}
  local t0=$(date +%s)
  $PY -m sim.warm_start --out-dir "$out/oracle" --n "${N_ORACLE:-2000}" $oracle ${model:+--model "$model"} --report &&
  $PY -m sim.qa --out-dir "$out/data" --prompt-template "$out/oracle/prompt_template.txt" \
    --train-size 2000 --val-size 100 --test-size "${TEST_SIZE:-300}" &&
  $PY -m verl.trainer.main_ppo --config-name sft "data.sft_files=[$out/oracle/oracle.parquet]" \
    "model.path=$out/oracle/model.json" "model.tokenizer=$out/oracle/tokenizer" \
    "trainer.output_dir=$out/sft" "trainer.hf_dir=$out/sft" trainer.resume=none trainer.total_epochs="${EPOCHS:-$epochs}" \
    trainer.time_limit_s=null actor.lr=5e-3 data.train_batch_size=16 actor.sft_context_loss_weight=1.0 \
    trainer.logger=[jsonl] &&
  cp "$out/oracle/prompt_template.txt" "$out/sft/prompt_template.txt" &&
  local t1=$(date +%s) &&
  $PY -m router_r1.eval.evaluate --checkpoint "$out/sft" --data "$out/data/test.parquet" --sim --greedy \
    --out "$out/eval" --max-turns 3 --max-obs-length 128 --response-length 64 --max-response-length 512 ${EXTRA_EVAL:-} &&
  echo "$v sft_s=$((t1 - t0)) eval_s=$(( $(date +%s) - t1 ))" >> "$W/times.txt"
}

pids=()
for v in ${VARIANTS:-base clean clean_syll clean_big syll_big clean_long syll_long}; do
  one "$v" > "$W/$v.log" 2>&1 &
  pids+=($!)
done
if [ -n "${WAIT_S:-}" ]; then  # stop what is still running after WAIT_S seconds and report the rest
  ( sleep "$WAIT_S"; pkill -f "$W/" ) & watchdog=$!
fi
wait "${pids[@]}"
[ -n "${watchdog:-}" ] && kill "$watchdog" 2>/dev/null
cat "$W/times.txt"
for v in ${VARIANTS:-base clean clean_syll clean_big syll_big clean_long syll_long}; do
  echo "== $v"; grep -E "^(all|oracle|confused|big|generalist|whole)|tokens:" "$W/$v.log" | head -8
  tail -25 "$W/$v.log" | grep -v "^\s*$" | tail -14
done | tee "$BACK/summary.txt"
tar czf "$BACK/runs.tgz" -C "$W" --exclude='*.safetensors' --exclude='*.pt' --exclude='checkpoints' . 2>/dev/null
ls -la "$BACK"
