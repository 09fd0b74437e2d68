"""Save the tokenizer stored in a GGUF file as a tokenizer directory (tokenizer.json + config).

Where one transformers converts a GGUF vocabulary soundly and another does not (5.17 splits
Gemma 3's words; load_tokenizer refuses it), convert here once and hand the directory to the
other machine: `TOKENIZER=dir` in experiments/gemma_h200/pipeline_gpu.sh, `model.tokenizer=dir` in training.

    python -m tools.convert.save_gguf_tokenizer gemma-3-270m-q4_k_m.gguf gemma_tokenizer/
"""
import argparse

from verl.utils.tokenizer import load_tokenizer, self_encoding_share


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", help="the .gguf file")
    p.add_argument("out", help="directory to write")
    args = p.parse_args(argv)
    tok = load_tokenizer(args.gguf)  # refuses an unsound conversion
    tok.save_pretrained(args.out)
    ok, n = self_encoding_share(load_tokenizer(args.out))
    print(f"wrote {args.out}: {len(tok)} tokens; {ok} of {n} plain vocabulary words encode to themselves")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
