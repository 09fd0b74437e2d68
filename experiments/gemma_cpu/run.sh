#!/usr/bin/env bash
# The pretrained Gemma 3 270M warm start, small and on CPU: does a sound tokenizer make it learn the
# router format at once? Data as experiments/gemma_h200/pipeline_gpu.sh makes it (32 oracle trajectories, 8 test
# questions), SFT 6 steps (batch 4, lr 5e-5), one PPO step (alpha 0.6), greedy evaluation of both.
#   bash experiments/gemma_cpu/run.sh GGUF TOKENIZER_DIR OUT
# TOKENIZER_DIR from `python -m tools.convert.save_gguf_tokenizer GGUF DIR`. The recorded run used
# transformers 5.17 (the H200's; PYTHONPATH to a side install) to check the device's version.
set -euo pipefail
cd "$(dirname "$0")/../.."
GGUF=${1:?gguf}; TOK=${2:?tokenizer dir}; OUT=${3:?output dir}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
$PY -c "import transformers; print('transformers', transformers.__version__)"
$PY -m sim.warm_start --out-dir "$OUT/oracle" --n 32 --world-entities 150 --noise 0.3 --report
$PY -m sim.qa --out-dir "$OUT/data" --prompt-template "$OUT/oracle/prompt_template.txt" --world-entities 150 \
  --train-size 2000 --val-size 200 --test-size 8
$PY -c "import pandas as pd, sys; d = sys.argv[1]
pd.read_parquet(f'{d}/val.parquet').head(4).to_parquet(f'{d}/val4.parquet')
pd.read_parquet(f'{d}/train.parquet').head(16).to_parquet(f'{d}/train16.parquet')" "$OUT/data"
$PY -m verl.trainer.sft --data "$OUT/oracle/oracle.parquet" --model "$GGUF" --tokenizer "$TOK" \
  --out "$OUT/sft" --epochs 1 --max-steps 6 --lr 5e-5 --batch-size 4 --context-loss-weight 1.0 --device cpu
cp "$OUT/oracle/prompt_template.txt" "$OUT/sft/"
source tools/sim_pool.sh
start_sim_pool "$OUT/pool.log"
$PY -m verl.trainer.main_ppo --config-name embedded \
  "data.train_files=[$OUT/data/train16.parquet]" "data.val_files=[$OUT/data/val4.parquet]" \
  data.train_batch_size=4 data.val_batch_size=4 "model.path=$OUT/sft" "model.tokenizer=$OUT/sft" \
  model.dtype=auto trainer.device=cpu rollout.name=hf rollout.max_batch_size=8 \
  actor.lr=2e-5 actor.ppo_mini_batch_size=2 actor.ppo_micro_batch_size=2 \
  critic.lr=1e-4 critic.ppo_mini_batch_size=2 critic.ppo_micro_batch_size=2 \
  env.pool_url="$URL" env.alpha=0.6 trainer.total_steps=1 trainer.test_freq=10 trainer.val_before_train=false \
  trainer.output_dir="$OUT/ppo" trainer.experiment_name=gemma_cpu > "$OUT/ppo.log" 2>&1
cp "$OUT/oracle/prompt_template.txt" "$OUT/ppo/hf/"
$PY -m router_r1.eval.evaluate --data "$OUT/data/test.parquet" --pool configs/pool/sim.yaml --pool-url "$URL" \
  --greedy --max-turns 3 --max-obs-length 128 --response-length 64 --max-response-length 512 --device cpu \
  --batch-size 8 --checkpoint "$OUT/sft" --checkpoint "$OUT/ppo/hf" --out "$OUT/eval"
