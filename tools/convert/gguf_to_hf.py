"""Turn a GGUF file into a transformers model directory (dequantised weights + tokenizer), checked.

transformers loads a GGUF (dequantising every tensor) but refuses to `save_pretrained` the
result ("quantized with gguf and is not serializable", 5.24): the model still carries its
GGUF quantizer although its weights are plain tensors by then. Dropping the quantizer and
`quantization_config` makes it an ordinary model that saves as safetensors.

Checked before anything is written: the tokenizer encodes its own vocabulary whole (the
check load_tokenizer makes on every GGUF). Checked after: the saved directory loads back
to the same logits (exactly, at the dtype it was saved in) and the same token ids.

    python -m tools.convert.gguf_to_hf SmolLM2-135M-Instruct.Q4_1.gguf smollm2_hf/ [--dtype bfloat16]

The directory serves a pool model anywhere a transformers directory is expected:
`python -m router_r1.pool.server --backend hf --hf-model NAME=smollm2_hf/`, `vllm serve smollm2_hf/`.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

PROBE = ["The capital of France is", "<think>Ask a model.</think>", "café naïve 東京 10:30"]


def convert(gguf_path: str, out_dir: str, dtype: str = "float32") -> dict:
    """Write out_dir; returns what was checked (tokens, self-encoding share, max logit difference)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.tokenizer import load_tokenizer, self_encoding_share
    from verl.workers.model_loader import load_model, to_dtype

    if not os.path.isfile(gguf_path):
        raise SystemExit(f"error: {gguf_path}: no such file")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise SystemExit(f"error: {out_dir} exists and is not empty; pick a new directory")
    try:
        tok = load_tokenizer(gguf_path)  # refuses a vocabulary converted unsoundly
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    ok, n = self_encoding_share(tok)
    model = load_model(gguf_path, to_dtype(dtype), role="rollout").eval()
    # The weights are dequantised already; what blocks saving is the quantizer left attached.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)

    again = AutoModelForCausalLM.from_pretrained(out_dir, dtype=model.dtype).eval()
    tok_again = AutoTokenizer.from_pretrained(out_dir)
    diff = 0.0
    for text in PROBE:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if tok_again(text, add_special_tokens=False)["input_ids"] != ids:
            raise SystemExit(f"error: {out_dir}: the saved tokenizer encodes {text!r} differently")
        with torch.no_grad():
            x = torch.tensor([ids])  # (1, len)
            diff = max(diff, (model(x).logits - again(x).logits).abs().max().item())
    if diff != 0.0:
        raise SystemExit(f"error: {out_dir}: the saved model's logits differ by up to {diff:g}")
    ok_again, _ = self_encoding_share(tok_again)
    if ok_again != ok:
        raise SystemExit(f"error: {out_dir}: the saved tokenizer encodes {ok_again} of {n} vocabulary words whole, "
                         f"the GGUF's {ok}")
    return {"tokens": len(tok), "self_encoding": (ok, n), "max_logit_diff": diff, "dtype": str(model.dtype),
            "chat_template": bool(getattr(tok, "chat_template", None))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", help="the .gguf file")
    p.add_argument("out", help="directory to write (new or empty)")
    p.add_argument("--dtype", default="float32", help="float32 (default) | bfloat16 | float16")
    a = p.parse_args(argv)
    r = convert(a.gguf, a.out, a.dtype)
    ok, n = r["self_encoding"]
    print(f"wrote {a.out}: {r['dtype']} weights, {r['tokens']} tokens ({ok} of {n} vocabulary words encode whole), "
          f"chat template {'kept' if r['chat_template'] else 'absent'}; reloaded: same ids, logits equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
