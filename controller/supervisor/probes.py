"""Readiness: `/health` answers AND one real chat completion succeeds.

`/health` alone is not enough: vLLM answers it as soon as the API server is up, and on the
reference host a first request can still fail (e.g. host curl `connection reset by peer` when the
engine is bound to 127.0.0.1 inside a bridge container, DOMAIN §5). One real completion through
the served model name proves the whole path the gateway will use.
"""

from __future__ import annotations

from typing import Any, Protocol

import aiohttp

from appliance.recipe.engine_key import bearer
from appliance.recipe.launch_spec import LaunchSpec


class Prober(Protocol):
    async def health(self, spec: LaunchSpec) -> str | None:
        """None when `/health` answered 200, else what went wrong (for the diagnosis)."""
        ...

    async def completion(self, spec: LaunchSpec, api_key: str | None = None) -> str | None:
        """None when one chat completion succeeded, else what went wrong. `api_key`: this launch's
        engine key (engine_key.py), sent as a bearer token — vLLM guards /v1 with it."""
        ...


class HttpProber:
    """The real prober (aiohttp). One session, created lazily inside the running loop."""

    def __init__(self, health_timeout_s: float = 5.0, completion_timeout_s: float = 120.0) -> None:
        self._health_timeout = aiohttp.ClientTimeout(total=health_timeout_s)
        # A first completion on a cold CPU engine can take seconds; on a busy machine longer.
        self._completion_timeout = aiohttp.ClientTimeout(total=completion_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def health(self, spec: LaunchSpec) -> str | None:
        url = spec.base_url + spec.probes.health_path
        try:
            async with self._s().get(url, timeout=self._health_timeout) as resp:
                if resp.status == 200:
                    return None
                return f"GET {spec.probes.health_path} → {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return f"GET {spec.probes.health_path}: {_describe(exc)}"

    async def completion(self, spec: LaunchSpec, api_key: str | None = None) -> str | None:
        p = spec.probes
        url = spec.base_url + p.completion_path
        body: dict[str, Any] = {
            "model": spec.served_model_name,
            "messages": [{"role": "user", "content": p.completion_prompt}],
            "max_tokens": p.completion_max_tokens,
            "temperature": 0,
        }
        headers = {"Authorization": bearer(api_key)} if api_key else None
        timeout = self._completion_timeout
        try:
            async with self._s().post(url, json=body, headers=headers, timeout=timeout) as resp:
                text = await resp.text()
                if resp.status == 401:
                    # Not this launch's engine (another one holds the port), or a key mismatch.
                    return (f"POST {p.completion_path} → 401: the engine answering on {spec.base_url} "
                            "does not accept this launch's key (is another engine on its port?)")
                if resp.status != 200:
                    return f"POST {p.completion_path} → {resp.status}: {text[:200]}"
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            return f"POST {p.completion_path}: {_describe(exc)}"
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices, list):
            return f"POST {p.completion_path}: no choices in the answer"
        return None


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]
