"""The Now page's "Try it" box: one chat completion through the gateway's client address, with a key
the operator pastes, made by the controller (server-side) so the browser needs no route to the gateway.

The key is a secret the console never keeps: it goes into one request's Authorization header and is
dropped; the page shows it only as `key_hint` ("sk-…last4"), and nothing here logs it or the request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

MAX_TOKENS = 32  # a short answer: this proves the path, it is not a playground
TIMEOUT_S = 60.0  # a cold engine's first answer may take a while; the gateway's own 503 comes at once
MAX_PROMPT_CHARS = 2000
_SHOWN_ERROR_CHARS = 300


@dataclass(frozen=True)
class TryResult:
    status: int | None  # None: no HTTP answer at all (refused, timed out)
    ttfb_ms: float | None  # request sent → response headers received
    answer: str | None
    error: str | None  # the gateway's own message (its OpenAI-style error object), or why no answer
    key: str  # key_hint of the key used, never the key


def key_hint(key: str) -> str:
    """"sk-…last4": enough to tell keys apart, too little to use. A key too short to hide 4 of its
    characters (not one the keystore issues) shows none."""
    prefix = "sk-" if key.startswith("sk-") else ""
    return f"{prefix}…{key[-4:]}" if len(key) >= 16 else f"{prefix}…"


def gateway_message(body: bytes) -> str:
    """The message of the gateway's `{"error": {"message": …}}`, else the body's first characters."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        message = data["error"].get("message")
        if isinstance(message, str) and message:
            return message[:_SHOWN_ERROR_CHARS]
    return body.decode(errors="replace").strip()[:_SHOWN_ERROR_CHARS] or "(empty answer)"


def _answer_text(body: bytes) -> str | None:
    try:
        data: Any = json.loads(body)
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


async def try_completion(gateway_url: str, key: str, model: str, prompt: str, *,
                         timeout_s: float = TIMEOUT_S) -> TryResult:
    """One non-streamed chat completion through the gateway; never raises for what the network or the
    gateway does (that is the result to show)."""
    hint = key_hint(key)
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS, "temperature": 0}
    headers = {"Authorization": f"Bearer {key}"}
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=5.0)
    started = time.perf_counter()
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
                gateway_url.rstrip("/") + "/v1/chat/completions", json=body, headers=headers) as resp:
            ttfb_ms = (time.perf_counter() - started) * 1000.0
            raw = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        # aiohttp's exceptions name the URL, never the request's headers.
        return TryResult(None, None, None, f"the gateway at {gateway_url} did not answer: "
                         f"{type(exc).__name__}{': ' + str(exc) if str(exc) else ''}", hint)
    if status != 200:
        return TryResult(status, ttfb_ms, None, gateway_message(raw), hint)
    answer = _answer_text(raw)
    if answer is None:
        return TryResult(status, ttfb_ms, None, "the answer is not a chat completion: "
                         + gateway_message(raw), hint)
    return TryResult(status, ttfb_ms, answer, None, hint)
