# Source me: `sim_warm_start` builds the 270M pipeline's warm start under $W (oracle trajectories, QA data,
# SFT model; experiments/gemma_h200/pipeline_gpu.sh run 1's settings) from $PY, $N_ORACLE, $MODEL, $SFT_EPOCHS and $DEVICE.
# The H200 scripts call it once per fresh machine (when $W/sft/config.json is missing).
sim_warm_start() {
  $PY -m sim.warm_start --out-dir "$W/oracle" --n "$N_ORACLE" --world-entities 150 --noise 0.3 --prefer-big 0.5 --report &&
  $PY -m sim.qa --out-dir "$W/data" --prompt-template "$W/oracle/prompt_template.txt" --world-entities 150 \
    --train-size 2000 --val-size 200 --test-size 300 &&
  $PY -m verl.trainer.sft --data "$W/oracle/oracle.parquet" --model "$MODEL" --tokenizer "$W/oracle/tokenizer" \
    --out "$W/sft" --epochs "$SFT_EPOCHS" --lr 3e-4 --batch-size 32 --context-loss-weight 1.0 --device "$DEVICE" &&
  cp "$W/oracle/prompt_template.txt" "$W/sft/prompt_template.txt"
}
