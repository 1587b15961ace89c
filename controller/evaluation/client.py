"""The one benchmark client (DOMAIN §7: "always the same client"): aiohttp against the engine's
OpenAI-compatible API, directly or through the gateway with a key.

Every request is a `/v1/completions` call with token-id prompts at temperature 0, so the input
length is exact and the same on every arm. Outputs stop naturally by default (the seed's runs did:
lengths then differ between arms and the gate checks them); `ignore_eos` with a fixed `max_tokens`
is the option for fixed lengths. Streaming gives TTFT (first
token chunk) and TPOT ((latency − TTFT) / (output tokens − 1)), the way `vllm bench serve` measures.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from appliance.evaluation.bench_result import RequestRecord


class EngineNotReady(RuntimeError):
    """The engine does not answer /health or /v1/models: nothing to benchmark."""


class ClientError(RuntimeError):
    pass


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class ChatAnswer:
    content: str
    reasoning: str | None
    finish_reason: str | None


class EngineClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 1800.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None
        self.model: str | None = None
        self.max_model_len: int | None = None

    async def __aenter__(self) -> EngineClient:
        # limit=0: the client never caps concurrency below what the bench asks for.
        self._session = aiohttp.ClientSession(
            timeout=self._timeout, headers=self._headers, connector=aiohttp.TCPConnector(limit=0)
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use EngineClient as an async context manager")
        return self._session

    async def discover(self) -> tuple[str, int]:
        """The served model and its context length, from /v1/models (vLLM reports max_model_len)."""
        try:
            async with self.session.get(
                f"{self.base_url}/v1/models", timeout=aiohttp.ClientTimeout(total=30)
            ) as r:
                if r.status != 200:
                    raise EngineNotReady(f"{self.base_url}/v1/models answered HTTP {r.status}")
                body = await r.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineNotReady(f"the engine at {self.base_url} does not answer: {exc!r}") from exc
        models = body.get("data") or []
        if not models:
            raise EngineNotReady(f"the engine at {self.base_url} serves no model")
        self.model = str(models[0]["id"])
        self.max_model_len = int(models[0].get("max_model_len") or 0) or None
        if self.max_model_len is None:
            raise ClientError("the engine does not report max_model_len: pass it explicitly")
        return self.model, self.max_model_len

    async def tokenize(self, text: str) -> list[int]:
        """The engine's own tokenizer (vLLM `/tokenize`, served next to /v1 on the engine port)."""
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        async with self.session.post(f"{self.base_url}/tokenize", json=body) as r:
            if r.status != 200:
                raise ClientError(
                    f"/tokenize answered HTTP {r.status}: the bench needs the engine's own "
                    "tokenizer (use the engine URL, not a proxy that only forwards /v1)"
                )
            data = await r.json()
        return [int(t) for t in data["tokens"]]

    def _body(
        self, prompt: list[int] | str, max_tokens: int, ignore_eos: bool, stream: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def timed(
        self, tier: str, index: int, prompt: list[int], max_tokens: int, ignore_eos: bool
    ) -> RequestRecord:
        """One streamed request: TTFT, TPOT, output length and text; failures are records, not raises."""
        rec: dict[str, Any] = {"tier": tier, "index": index, "input_tokens": len(prompt)}
        start = time.perf_counter()
        ttft: float | None = None
        text: list[str] = []
        usage_tokens: int | None = None
        chunks = 0
        try:
            async with self.session.post(
                f"{self.base_url}/v1/completions", json=self._body(prompt, max_tokens, ignore_eos, True)
            ) as r:
                if r.status != 200:
                    detail = (await r.text())[:300]
                    return RequestRecord(**rec, ok=False, error=f"HTTP {r.status}: {detail}")
                async for raw in r.content:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    event = json.loads(payload)
                    if event.get("error"):
                        return RequestRecord(**rec, ok=False, error=str(event["error"])[:300])
                    for choice in event.get("choices") or []:
                        if choice.get("text") is not None:
                            if ttft is None:
                                ttft = time.perf_counter() - start
                            text.append(choice["text"])
                            chunks += 1
                    usage = event.get("usage")
                    if usage:
                        usage_tokens = int(usage.get("completion_tokens") or 0)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return RequestRecord(**rec, ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
        latency = time.perf_counter() - start
        n = usage_tokens if usage_tokens is not None else chunks
        if ttft is None or n == 0:
            return RequestRecord(**rec, ok=False, error="the stream ended without a token")
        tpot = (latency - ttft) / (n - 1) * 1000 if n > 1 else None
        return RequestRecord(
            **rec,
            output_tokens=n,
            ttft_ms=ttft * 1000,
            tpot_ms=tpot,
            latency_ms=latency * 1000,
            text="".join(text),
            ok=True,
        )

    async def alive(self) -> bool:
        """The engine still answers (vLLM `/health` 200): the smoke's "API still alive"."""
        try:
            async with self.session.get(
                f"{self.base_url}/health", timeout=aiohttp.ClientTimeout(total=30)
            ) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def chat(self, prompt: str, max_tokens: int) -> str:
        """A greedy chat completion that stops naturally: its content."""
        return (await self.chat_answer(prompt, max_tokens)).content

    async def chat_answer(self, prompt: str, max_tokens: int) -> ChatAnswer:
        """A greedy chat completion that stops naturally (the accuracy sets' answers): its content
        and, where the engine's reasoning parser split it off, its reasoning text (vLLM names the
        field `reasoning_content`, newer releases `reasoning`)."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        for attempt in (1, 2):
            try:
                async with self.session.post(f"{self.base_url}/v1/chat/completions", json=body) as r:
                    if r.status != 200:
                        raise ClientError(
                            f"chat completion answered HTTP {r.status}: {(await r.text())[:300]}"
                        )
                    data = await r.json()
                break
            except aiohttp.ServerDisconnectedError as exc:
                # A pooled keep-alive connection the server had already closed (seen on the CPU pair):
                # the request never reached the engine, so sending it once more is safe at temperature 0.
                if attempt == 2:
                    raise ClientError(f"{type(exc).__name__}: {exc}"[:300]) from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ClientError(f"{type(exc).__name__}: {exc}"[:300]) from exc
        message = data["choices"][0].get("message") or {}
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        return ChatAnswer(
            content=str(message.get("content") or ""),
            reasoning=None if reasoning is None else str(reasoning),
            finish_reason=data["choices"][0].get("finish_reason"),
        )

    async def tokens(self, prompt: str, max_tokens: int) -> Completion:
        """A greedy chat completion and its output token ids (vLLM `return_token_ids`, which vLLM
        0.32 offers on chat completions only), for fingerprints."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        async with self.session.post(f"{self.base_url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                raise ClientError(f"chat completion answered HTTP {r.status}: {(await r.text())[:300]}")
            data = await r.json()
        choice = data["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise ClientError("the engine returned no token_ids (vLLM `return_token_ids` unsupported)")
        return Completion(
            text=(choice.get("message") or {}).get("content") or "",
            token_ids=[int(t) for t in ids],
            finish_reason=choice.get("finish_reason"),
        )
