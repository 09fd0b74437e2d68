# Sourced by run_gemma.sh and run_gemma_unseen.sh on the device: join the pieces prepare_gemma.sh made
# (.gg/b0, .gg/b1, ... copied to $PIECES by earlier calls), check the GGUF, install the carried wheels.
# Sets GGUF and TOKENIZER (the sound tokenizer directory when the bundle has it) and PYTHONPATH.
GG=/tmp/gg PIECES=${PIECES:-/tmp/pieces}
GGUF=$GG/gemma-3-270m-q4_k_m.gguf
SUM="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $GGUF"
mkdir -p "$GG"
# unpack unless a sound GGUF is there already (a call that failed part-way may have left a broken one)
if ! echo "$SUM" | sha256sum -c --status 2>/dev/null; then
  rm -f "$GGUF"
  if [ -f "$PIECES/b0" ]; then  # a missing piece fails the tar or the checksum below
    cat "$PIECES"/b[0-9] | tar x -C "$GG" && tar xzf "$GG/tok.tgz" -C "$GG"
  elif [ -f "$GG/c0" ]; then  # the older bare-GGUF pieces
    cat $GG/c0 $GG/c1 $GG/c2 $GG/c3 $GG/c4 > "$GGUF"
  fi
fi
echo "$SUM" | sha256sum -c || exit 1
if [ -d "$GG/whl" ]; then  # the device lacks hydra, omegaconf, openai, gguf
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$GG"/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
[ -d "$GG/tok" ] && TOKENIZER=${TOKENIZER:-$GG/tok}
