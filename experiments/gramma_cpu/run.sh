#!/usr/bin/env bash
# GraMMA on the synthetic knowledge graph, CPU: data -> oracle -> SFT -> GRPO -> evaluation
# -> paired comparison -> experience bank (advice from val failures, evaluated on test)
# [-> ADVICE_RL=1: GRPO with the advice in the training prompts].
#   bash experiments/gramma_cpu/run.sh [hydra overrides for the GRPO stage]
#   FROM_STAGE=4 bash ...   skips stages 1-3 (their outputs under $OUT are reused)
# Outputs under $OUT (default outputs/gramma); the numbers in README.md came from this script.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
OUT=${OUT:-outputs/gramma}
N_ORACLE=${N_ORACLE:-1500}
SFT_EPOCHS=${SFT_EPOCHS:-4}
GRPO_STEPS=${GRPO_STEPS:-60}
GRPO_LR=${GRPO_LR:-3e-4}
FROM_STAGE=${FROM_STAGE:-1}
ADVICE_RL=${ADVICE_RL:-0}  # 1: stage 8, GRPO from the same SFT model with advice in the training prompts
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
start=$(date +%s)
stage() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }
want() { [ "$1" -ge "$FROM_STAGE" ]; }

if want 1; then
  stage "1/7 synthetic graph and questions"
  $PY -m data_process.kg_synth --out-dir "$OUT/data"
fi

if want 2; then
  stage "2/7 oracle trajectories, tokenizer, model config"
  $PY -m data_process.kg_oracle --data "$OUT/data/train.parquet" --graph "$OUT/data/graph" --out-dir "$OUT/oracle" \
    --n "$N_ORACLE" --noise 0.3 --point
fi

if want 3; then
  stage "3/7 supervised warm start"
  $PY -m verl.trainer.sft --data "$OUT/oracle/oracle.parquet" --model "$OUT/oracle/model.json" \
    --tokenizer "$OUT/oracle/tokenizer" --out "$OUT/sft" --epochs "$SFT_EPOCHS" --lr 5e-3 --batch-size 16 \
    --context-loss-weight 1.0 --max-length 1024 --time-limit-s 1800
fi

if want 4; then
  stage "4/7 GRPO on the graph environment (no critic, no reference)"
  $PY -m verl.trainer.main_ppo --config-name gramma \
    "data.train_files=[$OUT/data/train.parquet]" "data.val_files=[$OUT/data/val.parquet]" data.val_limit=64 \
    "model.path=$OUT/sft" "model.tokenizer=$OUT/sft" "env.graph_dir=$OUT/data/graph" \
    "trainer.output_dir=$OUT/ppo" algorithm.adv_estimator=grpo rollout.n=4 data.train_batch_size=8 \
    actor.ppo_mini_batch_size=32 actor.ppo_micro_batch_size=16 algorithm.use_kl_in_reward=false \
    critic.enable=false "actor.lr=$GRPO_LR" "trainer.total_steps=$GRPO_STEPS" trainer.test_freq=20 "$@"
fi

if want 5; then
  stage "5/7 evaluation on the held-out test questions (greedy), and on val (the advice split)"
  $PY -m gramma.graph_eval --data "$OUT/data/test.parquet" --graph "$OUT/data/graph" \
    --checkpoint "$OUT/sft" --checkpoint "$OUT/ppo/hf" --out "$OUT/eval"
  $PY -m gramma.graph_eval --data "$OUT/data/val.parquet" --graph "$OUT/data/graph" \
    --checkpoint "$OUT/sft" --checkpoint "$OUT/ppo/hf" --out "$OUT/eval_val"
fi

if want 6; then
  stage "6/7 paired comparison on test: SFT -> GRPO"
  $PY -m gramma.compare "$OUT/eval/trajectories_sft.jsonl" "$OUT/eval/trajectories_hf.jsonl" --out "$OUT/eval/sft_vs_grpo.json"
fi

if want 7; then
  stage "7/7 experience bank: advice from each model's val failures, the same model on test with/without it"
  ckpt_sft="$OUT/sft"; ckpt_hf="$OUT/ppo/hf"
  for m in sft hf; do
    $PY -m gramma.experience --trajectories "$OUT/eval_val/trajectories_$m.jsonl" --out "$OUT/advice_$m.json" >/dev/null
    for mode in global per_kind; do
      flag=""; [ "$mode" = per_kind ] && flag=--per-kind
      $PY -m gramma.experience --bank "$OUT/advice_$m.json" --data "$OUT/data/test.parquet" \
        --out "$OUT/data/test_advice_${m}_$mode.parquet" $flag
      ckpt="ckpt_$m"
      $PY -m gramma.graph_eval --data "$OUT/data/test_advice_${m}_$mode.parquet" --graph "$OUT/data/graph" \
        --checkpoint "${!ckpt}" --out "$OUT/eval_advice_${m}_$mode"
      $PY -m gramma.compare "$OUT/eval/trajectories_$m.jsonl" "$OUT/eval_advice_${m}_$mode/trajectories_$m.jsonl" \
        --out "$OUT/eval_advice_${m}_$mode/compare.json"
    done
  done
fi
if want 8 && [ "$ADVICE_RL" = 1 ]; then
  stage "8/8 GRPO with advice in the prompts (the SFT model's val-failure bank, per kind), tested with the same advice"
  for split in train val; do
    $PY -m gramma.experience --bank "$OUT/advice_sft.json" --data "$OUT/data/$split.parquet" \
      --out "$OUT/data/${split}_advice.parquet" --per-kind
  done
  $PY -m verl.trainer.main_ppo --config-name gramma \
    "data.train_files=[$OUT/data/train_advice.parquet]" "data.val_files=[$OUT/data/val_advice.parquet]" data.val_limit=64 \
    data.max_prompt_length=320 \
    "model.path=$OUT/sft" "model.tokenizer=$OUT/sft" "env.graph_dir=$OUT/data/graph" \
    "trainer.output_dir=$OUT/ppo_advice" trainer.experiment_name=gramma_advice algorithm.adv_estimator=grpo rollout.n=4 \
    data.train_batch_size=8 actor.ppo_mini_batch_size=32 actor.ppo_micro_batch_size=16 algorithm.use_kl_in_reward=false \
    critic.enable=false "actor.lr=$GRPO_LR" "trainer.total_steps=$GRPO_STEPS" trainer.test_freq=20 "$@"
  $PY -m gramma.graph_eval --data "$OUT/data/test_advice_sft_per_kind.parquet" --graph "$OUT/data/graph" \
    --checkpoint "$OUT/ppo_advice/hf" --out "$OUT/eval_advice_rl"
  $PY -m gramma.compare "$OUT/eval/trajectories_hf.jsonl" "$OUT/eval_advice_rl/trajectories_hf.jsonl" \
    --out "$OUT/eval_advice_rl/compare.json"
fi
stage "done"
