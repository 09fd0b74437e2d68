"""An OpenAI-compatible endpoint for a trained router.

    python -m router_r1.serve --checkpoint outputs/embedded/ppo --pool configs/pool/sim.yaml --sim
    python -m router_r1.serve --checkpoint RUN --pool configs/pool/paper.yaml --token-env ROUTER_SERVE_TOKEN

`GET /v1/models`, `POST /v1/chat/completions`. The last user message is the question; the
server plays the router's episode (the training environment's turn rules, the same pool
client) and returns the final answer as the assistant message. `usage` counts the router's
tokens and the pool's; the `router_r1` field of the response carries the cost in USD, the
calls (model, sub-question, latency, cost) and, with `"trace": true`, the prompt and the
trajectory. `"stream": true` streams the final answer. An alpha-conditioned router takes
the cost weight from `"alpha": 0.6` in the body or a model name `router-r1@0.6`; a run trained
at one alpha answers another with a 400 saying how to train one that takes it. Without pool
flags the run's pool is used (serve_engine.pool_flags: in-process when simulated).

A failing pool model is an observation for the router, as in training; a request fails
(OpenAI-style error JSON) only when the router gives no answer. A bad request gets a JSON
4xx naming the field (router_r1/pool/chat_fields.py), and so does a field the router cannot
honour (`tools`, `stop`, `logprobs`, ...: NOT_HONOURED) or a question over --max-question-chars
(413, before tokenizing; shorter ones are tokenized off the event loop); the limits on what a client may
hold (body size, read and header timeouts, connections) are the shared HTTP layer's,
router_r1/pool/openai_http.py. Binds 127.0.0.1 unless
--host says otherwise; --token-env VAR requires `Authorization: Bearer $VAR`. Pool keys
come from the pool yaml's api_key_env and never reach a response or a log line.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

from aiohttp import web

from router_r1.pool import chat_fields
from router_r1.pool.errors import BadRequest
from router_r1.pool.openai_http import (MODEL_KEY, ServerSettings, application, bad_request_response,
                                        error_response, models_handler, read_json, serve_until_signal, start_site)
from router_r1.pool.server import ServerThread
from router_r1.flags import from_args, parser_for
from router_r1.prompts import build_router_prompt
from router_r1.qa_rows import MAX_QUESTION_CHARS  # one bound for a question, served or evaluated; 3.9 MB once stalled the server
from router_r1.router_env import RouterEnvConfig
from router_r1.trained_names import check_trained_names
from router_r1.runtime import (LOAD_ERRORS, ROLLOUTS, EnvOverrides, EvalError, Pool, Policy, PoolFlags, episode_config, episode_env,
                               fit_context, load_policy, quiet_transformers, resolve_checkpoint,
                               tokenize_prompt)
from router_r1.serve_engine import (MODEL_NAME, Answered, RunSettings, load_run_settings, model_id, play_episode,
                                    pool_flags, request_sampling)
from verl.workers.rollout.base import as_async

log = logging.getLogger("router_r1.serve")
# finish_reason of an answer taken from an episode that broke the output format (an answer block out of place, two of
# them, no <think> first ...): not one of OpenAI's values on purpose, so a client that expects "stop" notices
MALFORMED = "malformed"

# The request fields of OpenAI's chat completions: those the router acts on, those it takes without effect (they
# describe the caller, not the answer), and those it cannot honour, refused with a 400 naming them (as OpenAI refuses
# a parameter a model does not support) unless they hold their neutral value (which asks for what it does anyway).
HONOURED = {"model", "messages", "temperature", "top_p", "seed", "max_tokens", "max_completion_tokens", "stream",
            "stream_options", "n", "alpha", "trace"}
INFORMATIONAL = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
                 "parallel_tool_calls"}
NOT_HONOURED = {  # field -> (its neutral values, why it cannot be honoured)
    "tools": ([[]], "the router answers in text and calls no client tools"),
    "tool_choice": (["none"], "the router calls no client tools"),
    "functions": ([[]], "the router calls no client functions"),
    "function_call": (["none"], "the router calls no client functions"),
    "response_format": ([{"type": "text"}], "the answer is the router's text, not constrained to a format"),
    "logprobs": ([False], "the answer is extracted from an episode of several turns; no token logprobs are kept"),
    "top_logprobs": ([0], "no token logprobs are kept"),
    "stop": ([[]], "the episode's own stop tags end each turn"),
    "frequency_penalty": ([0], "the router decodes as it was trained"),
    "presence_penalty": ([0], "the router decodes as it was trained"),
    "logit_bias": ([{}], "the router decodes as it was trained"),
    "modalities": ([["text"]], "the router answers in text only"),
    "audio": ([], "the router answers in text only"),
    "prediction": ([], "predicted outputs are not supported"),
    "reasoning_effort": ([], "the router's turn budget is the run's"),
    "verbosity": ([], "the router's answer length is the run's"),
    "web_search_options": ([], "the router searches its pool, not the web"),
}


@dataclass
class ChatCall:
    question: str
    model: str
    alpha: float | None  # None: an unconditioned router (its prompt states no alpha)
    temperature: float | None
    top_p: float
    seed: int | None
    max_tokens: int | None  # the answer is cut to this many of the router's tokens (finish_reason "length")
    stream: bool
    include_usage: bool
    trace: bool


class RouterService:
    """One loaded router, its pool and environment, shared by every request."""

    def __init__(self, policy: Policy, pool: Pool, rcfg: RouterEnvConfig, settings: RunSettings,
                 name: str = MODEL_NAME, max_batch: int = 64, max_question_chars: int = MAX_QUESTION_CHARS):
        self.policy, self.pool, self.settings, self.name = policy, pool, settings, name
        self.max_question_chars = max_question_chars
        self.env = episode_env(rcfg, policy, pool)
        self.engine = as_async(policy.generate, max_batch)  # one engine: concurrent requests' turns share batches

    @property
    def conditioned(self) -> bool:
        return bool(self.settings.alphas)

    def model_ids(self) -> list[str]:
        return [self.name] + [model_id(self.name, a) for a in self.settings.alphas]

    def parse(self, body: object) -> ChatCall:
        """Validate a chat-completions body; BadRequest names the offending field."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        _refuse_unhonoured(body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' must be a non-empty string", "model")
        base, sep, at = model.partition("@")
        if base != self.name:
            raise BadRequest(f"model {model!r} does not exist (known: {self.model_ids()})", "model", 404,
                             "model_not_found")
        alpha = body.get("alpha")
        if sep:
            try:
                named = float(at)
            except ValueError:
                raise BadRequest(f"model {model!r}: the part after '@' must be a number (the alpha)", "model") from None
            if alpha is not None and alpha != named:
                raise BadRequest(f"'alpha' {alpha} disagrees with the model name {model!r}", "alpha")
            alpha = named
        if alpha is not None:
            asked = f"model {model[:100]!r}" if sep else f"'alpha' {repr(alpha)[:60]}"
            if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
                raise BadRequest(f"{asked}: the alpha must be a number in [0, 1]", "model" if sep else "alpha")
            if not self.conditioned and float(alpha) != self.settings.alpha:  # its own alpha asks what it does anyway
                raise BadRequest(f"{asked} asks for alpha {float(alpha):g}, but {self.settings.fixed_alpha()}",
                                 "model" if sep else "alpha", code="alpha_not_trained")
        alpha = (self.settings.alpha if alpha is None else float(alpha)) if self.conditioned else None
        messages = chat_fields.messages(body)
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users:
            raise BadRequest("'messages' holds no user message (the question)", "messages")
        question = messages[users[-1]]["content"]
        where = f"messages[{users[-1]}].content"
        if not question.strip():
            raise BadRequest(f"{where} is empty", where)
        if len(question) > self.max_question_chars:  # refused before tokenizing: a huge one costs seconds and memory
            raise BadRequest(f"{where} (the question) holds {len(question)} characters, over this server's bound of "
                             f"{self.max_question_chars} (--max-question-chars)", where, 413, "question_too_long")
        n = body.get("n")
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, float)) or n != 1):
            raise BadRequest(f"'n' must be 1 (one choice per request), got {n!r}"[:120], "n")
        temperature = chat_fields.number(body, "temperature", 0.0, 2.0, None)
        top_p = chat_fields.number(body, "top_p", 0.0, 1.0, 1.0, lo_open=True)
        _, max_tokens = chat_fields.max_tokens(body, None)
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object", "stream_options")
        return ChatCall(question, model, alpha, temperature, top_p, chat_fields.seed(body), max_tokens,
                        _flag(body, "stream"), _flag(options, "include_usage", "stream_options."), _flag(body, "trace"))

    def cut(self, answer: str, max_tokens: int | None) -> tuple[str, str]:
        """(the answer cut to max_tokens of the router's tokens, finish_reason)."""
        if max_tokens is None:
            return answer, "stop"
        ids = self.policy.tokenizer(answer, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return answer, "stop"
        return self.policy.tokenizer.decode(ids[:max_tokens], skip_special_tokens=True), "length"

    def prompt_ids(self, question: str, alpha: float | None) -> list[int]:
        messages = build_router_prompt(question, self.pool.registry, self.policy.template, alpha=alpha)
        return tokenize_prompt(self.policy.tokenizer, messages)

    async def answer(self, call: ChatCall) -> tuple[list[int], Answered]:
        # tokenized in a worker thread: a long question on the event loop stalls every other request
        prompt = await asyncio.get_running_loop().run_in_executor(None, self.prompt_ids, call.question, call.alpha)
        if self.policy.max_positions is not None and len(prompt) >= self.policy.max_positions:
            raise BadRequest(f"the question makes a prompt of {len(prompt)} tokens; the router's context holds "
                             f"{self.policy.max_positions}", "messages", code="context_length_exceeded")
        sampling = request_sampling(call.temperature, call.top_p, call.seed)
        return prompt, await play_episode(self.env, prompt, self.engine, sampling)

    def completion(self, call: ChatCall, prompt: list[int], done: Answered) -> dict:
        """The chat.completion body (without choices' content for streaming, which adds it in chunks)."""
        ep = done.episode
        router_out = int(sum(ep.response_mask))
        router_in = len(prompt) + len(ep.response_mask) - router_out  # the prompt and the information blocks
        pool_in = sum(c.prompt_tokens for c in done.calls)
        pool_out = sum(c.completion_tokens for c in done.calls)
        ext = {"alpha": call.alpha, "cost_usd": done.cost_usd, "latency_s": done.wall_s, "turns": ep.turn,
               "format_ok": done.format_ok, "format_reason": done.format_reason,
               "calls": [{"model": c.model, "sub_question": c.sub_question, "ok": c.ok, "error": c.error,
                          "latency_s": c.latency_s, "cost_usd": c.cost_usd} for c in done.calls],
               "usage": {"router_prompt_tokens": router_in, "router_completion_tokens": router_out,
                         "pool_prompt_tokens": pool_in, "pool_completion_tokens": pool_out}}
        if call.trace:
            ext["trace"] = {"prompt": self.policy.tokenizer.decode(prompt, skip_special_tokens=True),
                            "trajectory": ep.text,
                            "turns": [{k: t.get(k) for k in ("action", "model", "query", "answer", "reason", "ok",
                                                             "error", "cost_usd", "latency_s", "information")}
                                      for t in ep.turns]}
        answer, finish = (None, "stop") if done.answer is None else self.cut(done.answer, call.max_tokens)
        if answer is not None and not done.format_ok:
            finish = MALFORMED
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": call.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                             "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": router_in + pool_in, "completion_tokens": router_out + pool_out,
                          "total_tokens": router_in + pool_in + router_out + pool_out},
                "router_r1": ext}

    async def aclose(self) -> None:
        await self.pool.client.aclose()  # the HTTP clients this loop opened


def no_answer_error(done: Answered, ext: dict) -> web.Response:
    """HTTP 500 router_no_answer, with the calls made (and the trace when asked) beside the error."""
    ep = done.episode
    why = ("the response length budget ran out" if ep.truncated else
           "the turn budget ran out" if ep.hit_budget else f"its output has no answer ({done.format_reason})")
    body = {"error": {"message": f"the router did not answer: {why}", "type": "server_error", "param": None,
                      "code": "router_no_answer"}, "router_r1": ext}
    # 500, but not worth a retry by the client (the openai SDK reads x-should-retry)
    return web.json_response(body, status=500, headers={"x-should-retry": "false"})


def _refuse_unhonoured(body: dict) -> None:
    """A 400 naming the first field the router would not honour (an unknown one, or one of NOT_HONOURED set to
    something other than its neutral value); null counts as absent."""
    for key, value in body.items():
        if value is None or key in HONOURED or key in INFORMATIONAL:
            continue
        if key not in NOT_HONOURED:
            raise BadRequest(f"Unrecognized request argument supplied: {key[:100]}", key[:100],
                             code="unknown_parameter")
        neutral, why = NOT_HONOURED[key]
        # JSON's false is not its 0 (Python's == says it is)
        if not any(value is n if isinstance(value, bool) or isinstance(n, bool) else value == n for n in neutral):
            raise BadRequest(f"'{key}' is not supported by the router server: {why}; leave it out", key,
                             code="unsupported_parameter")


def _flag(body: dict, key: str, prefix: str = "") -> bool:
    """body[key] as a bool (absent or null: False); another type is refused, naming the field."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{prefix}{key}' must be true or false", prefix + key)
    return bool(value)


def make_router_app(service: RouterService, token: str | None = None,
             settings: ServerSettings | None = None) -> web.Application:
    """The aiohttp application serving `service` under /v1."""
    settings = settings or ServerSettings()
    list_models = models_handler(service.model_ids)

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            call = service.parse(await read_json(request, settings))
        except BadRequest as e:
            return bad_request_response(e)
        request[MODEL_KEY] = call.model  # named in the log line if the client leaves before the reply
        try:
            prompt, done = await service.answer(call)
        except BadRequest as e:
            return bad_request_response(e)
        except Exception as e:  # a bug or a dead model: the server's error, said without internals
            log.exception("request failed")
            return error_response(500, f"router error: {type(e).__name__}", "server_error")
        log.info("%s alpha=%s calls=%d cost_usd=%.3g answered=%s %.2fs", call.model, call.alpha, len(done.calls),
                 done.cost_usd, done.answer is not None, done.wall_s)
        body = service.completion(call, prompt, done)
        if done.answer is None:
            return no_answer_error(done, body["router_r1"])
        if not call.stream:
            return web.json_response(body)
        return await stream(request, call, body)

    async def on_cleanup(app: web.Application) -> None:
        await service.aclose()

    app = application(settings, token)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat)
    app.on_cleanup.append(on_cleanup)
    return app


async def stream(request: web.Request, call: ChatCall, body: dict) -> web.StreamResponse:
    """The answer as server-sent chat.completion.chunk events (word pieces), then usage if asked, then [DONE]."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    head = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    async def send(delta: dict, finish: str | None = None, **extra) -> None:
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

    answer = body["choices"][0]["message"]["content"]
    await send({"role": "assistant", "content": ""})
    for piece in _pieces(answer):
        await send({"content": piece})
    await send({}, body["choices"][0]["finish_reason"], router_r1=body["router_r1"])
    if call.include_usage:
        await resp.write(f"data: {json.dumps({**head, 'choices': [], 'usage': body['usage']})}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _pieces(text: str) -> list[str]:
    """Words with their following spaces: joined they give `text` back exactly."""
    return re.findall(r"\s+|\S+\s*", text)


class RouterServerThread(ServerThread):
    """The router server in a background thread with its own event loop (tests, benchmarks)."""

    def __init__(self, service: RouterService, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 settings: ServerSettings | None = None):
        super().__init__(service, host, port, token, settings=settings)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        runner, self.port = await start_site(make_router_app(self.backend, self._token, self._settings), self.host,
                                             self.port, self._settings)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()


# ---------------------------------------------------------------------------------- CLI

def build_service(policy: Policy, pool: Pool, settings: RunSettings, name: str = MODEL_NAME,
                  max_batch: int = 64, max_question_chars: int = MAX_QUESTION_CHARS) -> RouterService:
    """The service over a loaded policy and an open pool; the episode's settings are the run's."""
    rcfg = episode_config(settings.env)
    if settings.alphas and policy.template is not None and not any(
            p in policy.template for p in ("{alpha}", "{budget}")):
        raise EvalError("the run is alpha-conditioned but its prompt template has neither {alpha} nor {budget}")
    probe = tokenize_prompt(policy.tokenizer, build_router_prompt("?", pool.registry, policy.template,
                                                                  alpha=settings.alpha if settings.alphas else None))
    rcfg = fit_context([probe], ["the prompt template"], policy, rcfg, log=log.warning)
    return RouterService(policy, pool, rcfg, settings, name, max_batch, max_question_chars)


@dataclass
class ServeConfig(PoolFlags, EnvOverrides):
    """The router server's settings; each field is a flag of `python -m router_r1.serve` (router_r1/flags.py)."""

    checkpoint: str = field(default="", metadata={"required": True})  # a run's output dir (its hf/ export) or an HF model dir
    pool: Optional[str] = None  # pool yaml (default: the run's, in-process when simulated, else at the run's env.pool_url; no run config: the simulated pool)
    sim_latency: float = 1.0  # scale of the simulated latencies (0: the sim answers at once)
    host: str = "127.0.0.1"  # address to bind (another than loopback exposes the router: set --token-env)
    port: int = 8080  # port to listen on
    token_env: Optional[str] = field(default=None, metadata={"metavar": "VAR"})  # require 'Authorization: Bearer $VAR' on every request
    model_name: str = MODEL_NAME  # the model id clients ask for (an alpha-conditioned run adds NAME@ALPHA ids)
    alphas: Optional[list[float]] = None  # declare the run alpha-conditioned on these where no saved config says (a run saved with one alpha refuses them; a conditioned one takes its trained ones)
    prompt_template: Optional[str] = None  # template file of the router prompt (default: the checkpoint's prompt_template.txt)
    device: Optional[str] = None  # torch device (default: cuda if available)
    rollout: str = field(default="auto", metadata={"choices": ROLLOUTS})  # decoding backend: auto = hf_static on CUDA where the model type allows, else hf
    max_batch: int = 64  # most requests in one generate call
    max_question_chars: int = MAX_QUESTION_CHARS  # a longer question (the last user message) gets 413 before tokenizing
    server: Optional[ServerSettings] = field(default=None, metadata={"no_flag": True})  # time, byte and connection limits per client (ServerSettings' own flags)


def parse_args(argv: list[str] | None = None) -> ServeConfig:
    p = parser_for(ServeConfig, "python -m router_r1.serve", __doc__.split("\n\n")[0])
    ServerSettings.add_args(p)
    a = p.parse_args(argv)
    try:
        return from_args(ServeConfig, a, server=ServerSettings.from_args(a))
    except ValueError as e:
        p.error(str(e))


@contextmanager
def serving(a: ServeConfig) -> Iterator[RouterService]:
    """The service the CLI serves: checkpoint, the run's settings (flags override), pool and policy."""
    ckpt = resolve_checkpoint(a.checkpoint)
    settings = load_run_settings(ckpt, a, a.alphas)
    env = settings.env
    with pool_flags(a, settings).open(env, settings.pool) as pool:
        check_trained_names(ckpt, pool.registry, a.prompt_template, a.allow_unseen_models, log.warning)
        quiet_transformers()
        policy = load_policy(ckpt, a.device, a.prompt_template, a.rollout, a.max_batch, env.constrain_names)
        if a.max_question_chars < 1:
            raise EvalError(f"--max-question-chars must be >= 1, got {a.max_question_chars}")
        service = build_service(policy, pool, settings, a.model_name, a.max_batch, a.max_question_chars)
        log.info("serving %s as %s; settings from %s: max_turns=%d max_obs_length=%d response_length=%d "
                 "max_response_length=%d, alphas %s; pool %s", ckpt, service.model_ids(), settings.source,
                 env.max_turns, env.max_obs_length, env.response_length, env.max_response_length,
                 list(settings.alphas) or f"fixed {settings.alpha:g}", pool.where)
        yield service


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("httpx", "httpx2", "openai"):  # one line per pool call otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    token = None
    if a.token_env:
        token = os.environ.get(a.token_env)
        if not token:
            print(f"error: --token-env {a.token_env}: that environment variable is not set or empty", file=sys.stderr)
            return 2
    settings = a.server
    try:
        with serving(a) as service:
            asyncio.run(_serve_forever(service, a.host, a.port, token, settings))
    except LOAD_ERRORS as e:
        print(f"error: {str(e).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    return 0


async def _serve_forever(service: RouterService, host: str, port: int, token: str | None,
                         settings: ServerSettings) -> None:
    await serve_until_signal(make_router_app(service, token, settings), host, port,
                             f"router server listening on {{url}} (auth {'on' if token else 'off'})", settings)


if __name__ == "__main__":
    sys.exit(main())
