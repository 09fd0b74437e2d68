#!/usr/bin/env bash
# (run from the repository root) continue one SFT of outputs/alpha_tradeoff from its 3-epoch checkpoint to 6 epochs, in a copy: $1 name (sft_cond, sft_fixed_0.9), $2 oracle dir
set -euo pipefail
O=outputs/alpha_tradeoff
[ -d "$O/${1}_6ep" ] || cp -r "$O/$1" "$O/${1}_6ep"
OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false python -m verl.trainer.main_ppo --config-name sft "data.sft_files=[$2/oracle.parquet]" \
  "model.path=$O/oracle/model.json" "model.tokenizer=$O/oracle/tokenizer" "trainer.output_dir=$O/${1}_6ep" \
  "trainer.hf_dir=$O/${1}_6ep" trainer.resume=auto trainer.total_epochs=6 trainer.total_steps=null actor.lr=5e-3 \
  data.train_batch_size=16 actor.sft_context_loss_weight=1.0 "data.prompt_template=$O/oracle/prompt_template.txt" \
  > "$O/logs/${1}_6ep.log" 2>&1
