"""Local transformers models as a pool back end (chat template + generate).

One request at a time per backend: generation runs in a worker thread so the server's
event loop stays responsive, and a lock keeps the seeded RNG and the model's memory
use predictable. Good for small local pools and tests, not for throughput.
"""
from __future__ import annotations

import asyncio
import os
import threading

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

class HFBackend:
    """{api_id: model dir or (model, tokenizer)} served through each tokenizer's chat template."""

    def __init__(self, models: dict, device: str = "cpu", dtype: torch.dtype | None = None):
        if not models:
            raise ValueError("HFBackend: no models given")
        self.device = torch.device(device)
        self._models: dict[str, tuple[PreTrainedModel, PreTrainedTokenizerBase]] = {}
        for api_id, src in models.items():
            if isinstance(src, tuple):
                model, tok = src
            elif isinstance(src, (str, os.PathLike)):
                if not os.path.isdir(src):
                    raise ValueError(f"HFBackend: model {api_id!r}: {src} is not a directory")
                tok = AutoTokenizer.from_pretrained(src)
                model = AutoModelForCausalLM.from_pretrained(src, **({"dtype": dtype} if dtype else {}))
            else:
                raise ValueError(f"HFBackend: model {api_id!r}: expected a directory or (model, tokenizer), "
                                 f"got {type(src).__name__}")
            if not getattr(tok, "chat_template", None):
                raise ValueError(f"HFBackend: model {api_id!r}: the tokenizer has no chat_template")
            self._models[api_id] = (model.to(self.device).eval(), tok)
        self._lock = threading.Lock()

    def model_ids(self) -> list[str]:
        return list(self._models)

    async def complete(self, api_id: str, messages: list[dict], temperature: float, max_tokens: int,
                       seed: int | None) -> tuple[str, int, int]:
        """Greedy when temperature == 0, else sampled (seeded if `seed` is given)."""
        return await asyncio.to_thread(self.generate, api_id, messages, temperature, max_tokens, seed)

    @torch.no_grad()
    def generate(self, api_id: str, messages: list[dict], temperature: float, max_tokens: int,
                 seed: int | None = None) -> tuple[str, int, int]:
        """(text, prompt_tokens, completion_tokens); the end-of-sequence token is not counted."""
        model, tok = self._models[api_id]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(self.device)
        prompt_len = enc["input_ids"].shape[1]
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tok.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids), 0)
        kwargs = dict(max_new_tokens=max_tokens, pad_token_id=pad)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        with self._lock, torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
            if seed is not None:
                torch.manual_seed(seed)
            out = model.generate(**enc, **kwargs)  # (1, prompt_len + new_len)
        new = out[0, prompt_len:].tolist()  # (new_len,)
        for i, t in enumerate(new):
            if t in eos_ids:
                new = new[:i]
                break
        return tok.decode(new, skip_special_tokens=True), prompt_len, len(new)
