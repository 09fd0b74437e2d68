"""Local transformers models as a pool back end, with dynamic batching.

Concurrent requests for one model are gathered for up to `batch_window_s` (or until
`max_batch_size` are waiting) and decoded together in one left-padded `generate` call.
Greedy requests give the same text batched as alone; a request with a seed is decoded
alone, so its seeded sampling stays reproducible. Generation runs in a worker thread (the
server's event loop stays responsive) and one batch runs at a time on the device.

The queue is bounded: with `max_queue` requests of a model already waiting, `complete`
raises `Overloaded` (the server answers 429 with a Retry-After estimate), so a burst gets
a clear answer to back off on instead of timing out in a queue nobody can see.

A prompt longer than `max_prompt_tokens`, or one that with `max_tokens` would run past the
model's context, is refused (BadRequest, a 400 naming `messages`) before it reaches the device:
one 3 MB request otherwise held the device for many minutes. On shutdown (`aclose`) a running
batch stops at its next token and waiting requests are failed, so SIGTERM ends the server.

A model is a directory (`save_pretrained` layout), a `.gguf` file (dequantised by
transformers, the tokenizer checked as the policy's is), or an in-memory (model, tokenizer).
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteria

from router_r1.pool.errors import BadRequest, Overloaded

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    temperature: float
    max_tokens: int
    seed: int | None
    future: asyncio.Future
    queued_at: float = field(default_factory=time.monotonic)


@dataclass
class Completion:
    """One answered request, with where its time went."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    queue_s: float  # waiting for a batch slot
    compute_s: float  # the batch's generate call
    batch_size: int


class _AllGone(StoppingCriteria):
    """Stop a batch early once every one of its clients has given up (a timeout cancels its future), or
    the server is stopping: a server behind on its queue should not keep decoding replies nobody reads."""

    def __init__(self, batch: list[_Request], closing: threading.Event):
        self.batch, self.closing = batch, closing

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        # reads of flags; safe from this thread
        gone = self.closing.is_set() or all(r.future is not None and r.future.cancelled() for r in self.batch)
        return torch.full((input_ids.shape[0],), gone, dtype=torch.bool, device=input_ids.device)


def load_model_and_tokenizer(src, dtype: torch.dtype | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A directory or a .gguf file -> (model, tokenizer); ValueError names the path when it is neither."""
    from verl.utils.tokenizer import load_tokenizer

    src = os.fspath(src)
    if src.endswith(".gguf"):
        if not os.path.isfile(src):
            raise ValueError(f"{src}: GGUF file not found")
        try:
            import gguf  # noqa: F401  (transformers reads .gguf files through it)
        except ImportError:
            raise ValueError(f"{src}: serving a .gguf file needs the gguf package: pip install -e '.[gguf]' "
                             "(or a directory from tools/convert/gguf_to_hf.py)") from None
        from verl.workers.model_loader import load_model

        tok = load_tokenizer(src)  # refuses a vocabulary transformers converted unsoundly
        model = load_model(src, dtype or torch.float32, role="rollout")
        return model, tok
    if not os.path.isdir(src):
        raise ValueError(f"{src} is not a directory or a .gguf file")
    tok = load_tokenizer(src)
    model = AutoModelForCausalLM.from_pretrained(src, **({"dtype": dtype} if dtype else {}))
    return model, tok


class HFBackend:
    """{api_id: model dir, .gguf file or (model, tokenizer)} served through each tokenizer's chat template."""

    def __init__(self, models: dict, device: str = "cpu", dtype: torch.dtype | None = None,
                 max_batch_size: int = 8, batch_window_s: float = 0.02, max_queue: int = 256,
                 max_prompt_tokens: int = 8192):
        if not models:
            raise ValueError("HFBackend: no models given")
        if max_batch_size < 1 or max_queue < 1 or batch_window_s < 0 or max_prompt_tokens < 1:
            raise ValueError(f"HFBackend: max_batch_size, max_queue and max_prompt_tokens must be >= 1 and "
                             f"batch_window_s >= 0, got {max_batch_size}, {max_queue}, {max_prompt_tokens}, "
                             f"{batch_window_s}")
        self.device = torch.device(device)
        self.max_batch_size, self.batch_window_s, self.max_queue = max_batch_size, batch_window_s, max_queue
        self.max_prompt_tokens = max_prompt_tokens
        self._closing = threading.Event()  # set by aclose: a running batch stops at its next token
        self._waiting: set[asyncio.Future] = set()  # every request not answered yet, queued or decoding
        self._models: dict[str, tuple[PreTrainedModel, PreTrainedTokenizerBase]] = {}
        for api_id, src in models.items():
            if isinstance(src, tuple):
                model, tok = src
            elif isinstance(src, (str, os.PathLike)):
                try:
                    model, tok = load_model_and_tokenizer(src, dtype)
                except ValueError as e:
                    raise ValueError(f"HFBackend: model {api_id!r}: {e}") from e
            else:
                raise ValueError(f"HFBackend: model {api_id!r}: expected a directory, a .gguf file or "
                                 f"(model, tokenizer), got {type(src).__name__}")
            if not getattr(tok, "chat_template", None):
                raise ValueError(f"HFBackend: model {api_id!r}: the tokenizer has no chat_template")
            self._models[api_id] = (model.to(self.device).eval(), tok)
        self._device_lock = threading.Lock()  # one batch on the device at a time
        self._queues: dict[str, list[_Request]] = {m: [] for m in self._models}
        self._tokenizing: dict[str, int] = {m: 0 for m in self._models}  # admitted, not queued yet
        self._wakeups: dict[str, asyncio.Event] = {}
        self._workers: dict[str, asyncio.Task] = {}
        self._batch_s = 1.0  # running mean of a batch's duration, for Retry-After

    def model_ids(self) -> list[str]:
        return list(self._models)

    def prompt_ids(self, api_id: str, messages: list[dict]) -> list[int]:
        tok = self._models[api_id][1]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tok(prompt, add_special_tokens=False)["input_ids"]

    async def complete(self, api_id: str, messages: list[dict], temperature: float, max_tokens: int,
                       seed: int | None) -> tuple[str, int, int]:
        """(text, prompt_tokens, completion_tokens); greedy when temperature == 0."""
        done = await self.submit(api_id, messages, temperature, max_tokens, seed)
        return done.text, done.prompt_tokens, done.completion_tokens

    def check_length(self, api_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """BadRequest (context_length_exceeded) for a prompt over max_prompt_tokens or past the model's context."""
        if prompt_tokens > self.max_prompt_tokens:
            raise BadRequest(f"the messages make a prompt of {prompt_tokens} tokens; this server takes at most "
                             f"{self.max_prompt_tokens} (--max-prompt-tokens)", "messages",
                             code="context_length_exceeded")
        context = getattr(self._models[api_id][0].config, "max_position_embeddings", None)
        if context is not None and prompt_tokens + max_tokens > context:
            raise BadRequest(f"model {api_id!r} holds {context} tokens; the request asks for {prompt_tokens} in the "
                             f"messages and up to {max_tokens} in the completion: lower max_tokens", "max_tokens",
                             code="context_length_exceeded")

    async def submit(self, api_id: str, messages: list[dict], temperature: float, max_tokens: int,
                     seed: int | None) -> Completion:
        """Queue one request for the next batch of its model; Overloaded when the queue is full, BadRequest
        when it is too long."""
        queue = self._queues[api_id]
        waiting = len(queue) + self._tokenizing[api_id]
        if waiting >= self.max_queue:
            batches_ahead = math.ceil(waiting / self.max_batch_size)
            raise Overloaded(f"model {api_id!r}: {waiting} requests queued (server max_queue {self.max_queue})",
                             retry_after_s=min(60.0, max(1.0, batches_ahead * self._batch_s)))
        if self._closing.is_set():
            raise Overloaded("the server is shutting down", retry_after_s=5.0)
        # a body of megabytes takes seconds to tokenize: off the event loop, holding its place in the queue
        self._tokenizing[api_id] += 1
        try:
            prompt = await asyncio.to_thread(self.prompt_ids, api_id, messages)
        finally:
            self._tokenizing[api_id] -= 1
        self.check_length(api_id, len(prompt), max_tokens)
        loop = asyncio.get_running_loop()
        req = _Request(prompt, temperature, max_tokens, seed, loop.create_future())
        queue.append(req)
        self._worker(api_id).set()
        self._waiting.add(req.future)
        try:
            return await req.future
        finally:
            self._waiting.discard(req.future)

    def _worker(self, api_id: str) -> asyncio.Event:
        """The model's batching task on the running loop (started on first use); returns its wake-up event."""
        task = self._workers.get(api_id)
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            self._wakeups[api_id] = asyncio.Event()
            self._workers[api_id] = asyncio.get_running_loop().create_task(self._serve(api_id))
        return self._wakeups[api_id]

    async def _serve(self, api_id: str) -> None:
        queue, wake = self._queues[api_id], self._wakeups[api_id]
        while True:
            while not queue:
                wake.clear()
                await wake.wait()
            # a short window lets a burst gather into one batch; a full batch goes at once
            deadline = time.monotonic() + self.batch_window_s
            while len(queue) < self.max_batch_size and time.monotonic() < deadline:
                await asyncio.sleep(min(0.002, max(0.0, deadline - time.monotonic())))
            batch = self._take_batch(queue)
            if not batch:
                continue
            t0 = time.monotonic()
            try:
                outs = await asyncio.to_thread(self._generate, api_id, batch)
            except Exception as e:  # the server turns it into a 500 for each request of the batch
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(e)
                continue
            compute = time.monotonic() - t0
            self._batch_s = 0.8 * self._batch_s + 0.2 * compute
            log.debug("%s: batch of %d in %.3f s, %d still queued", api_id, len(batch), compute, len(queue))
            for r, (text, n_new) in zip(batch, outs):
                if not r.future.done():  # its client may have gone
                    r.future.set_result(Completion(text, len(r.prompt_ids), n_new, t0 - r.queued_at, compute,
                                                   len(batch)))

    async def aclose(self) -> None:
        """Stop the running batch at its next token, fail the requests waiting and stop the batching tasks of the
        running loop (the server calls this on shutdown); the back end can serve another loop afterwards."""
        loop = asyncio.get_running_loop()
        self._closing.set()
        try:
            for future in [f for f in self._waiting if f.get_loop() is loop and not f.done()]:
                future.set_exception(Overloaded("the server is shutting down", retry_after_s=5.0))
            for queue in self._queues.values():
                queue[:] = [r for r in queue if r.future.get_loop() is not loop]
            for api_id, task in list(self._workers.items()):
                if task.get_loop() is loop and not task.done():
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                self._workers.pop(api_id, None)
            # a cancelled task leaves its generate call running in its thread until the next token: wait for it
            await asyncio.to_thread(self._device_lock.acquire)
            self._device_lock.release()
        finally:
            self._closing.clear()

    def _take_batch(self, queue: list[_Request]) -> list[_Request]:
        """Up to max_batch_size live requests that can share one generate call (same sampling, no seed)."""
        queue[:] = [r for r in queue if not r.future.done()]  # cancelled by a client that gave up
        if not queue:
            return []
        first = queue[0]
        if first.seed is not None:  # seeded sampling: alone, so the seed means what it says
            batch = [first]
        else:
            batch = [r for r in queue if r.seed is None and r.temperature == first.temperature][:self.max_batch_size]
        taken = {id(r) for r in batch}
        queue[:] = [r for r in queue if id(r) not in taken]
        return batch

    @torch.no_grad()
    def _generate(self, api_id: str, batch: list[_Request]) -> list[tuple[str, int]]:
        """One left-padded generate call for the batch; (text, new tokens) per request, EOS not counted."""
        model, tok = self._models[api_id]
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tok.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos_ids), 0)
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch],
                           device=self.device)  # (batch, width)
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch],
                            device=self.device)  # (batch, width)
        temperature = batch[0].temperature
        kwargs = dict(max_new_tokens=max(r.max_tokens for r in batch), pad_token_id=pad)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        kwargs["stopping_criteria"] = [_AllGone(batch, self._closing)]
        with self._device_lock, torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
            if batch[0].seed is not None:
                torch.manual_seed(batch[0].seed)
            out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)  # (batch, width + new)
        results = []
        for r, row in zip(batch, out[:, width:].tolist()):
            new = row[: r.max_tokens]  # a longer neighbour does not lengthen this reply
            for i, t in enumerate(new):
                if t in eos_ids:
                    new = new[:i]
                    break
            results.append((tok.decode(new, skip_special_tokens=True), len(new)))
        return results

    def generate(self, api_id: str, messages: list[dict], temperature: float, max_tokens: int,
                 seed: int | None = None) -> tuple[str, int, int]:
        """One request alone, synchronously (no queue): the reference the batched path must match."""
        req = _Request(self.prompt_ids(api_id, messages), temperature, max_tokens, seed, future=None)
        self.check_length(api_id, len(req.prompt_ids), max_tokens)
        (text, n_new), = self._generate(api_id, [req])
        return text, len(req.prompt_ids), n_new
