"""Per-key usage: what the proxy reports when a request ends, summed per key per hour in memory,
counted in Prometheus, charged to the token quotas, and written to ``usage.store`` off the request
path.

The request path does dictionary arithmetic only (``Accounting.record``). A writer task hands the
pending sums to a worker thread every ``flush_s``; a batch that cannot be written (disk full, file
removed, locked) is merged back and retried. The pending sums are bounded (``max_pending`` rows of
key × hour): past that, a request's usage is dropped, and the drop is counted
(``appliance_gateway_usage_dropped_total``, alert ``ApplianceGatewayUsageLost``) and logged, never silent.
A failing store never fails a request.

Metrics: ``usage.metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from controller.gateway.keystore import KeyRecord
from controller.gateway.limits import LimitExceeded
from controller.gateway.usage.meter import Usage
from controller.gateway.usage.metrics import UsageMetrics
from controller.gateway.usage.quota import TokenQuotas
from controller.gateway.usage.request import RequestFacts
from controller.gateway.usage.store import HourUsage, UsageSlot, UsageStore, UsageStoreError, hour_of

log = logging.getLogger(__name__)

class Accounting:
    """The proxy's hooks: ``admit`` before a request goes upstream, ``record`` when it ended."""

    def __init__(
        self,
        store: UsageStore,
        metrics: UsageMetrics,
        quotas: TokenQuotas | None = None,
        *,
        flush_s: float = 2.0,
        retention_days: float = 90.0,
        max_pending: int = 10_000,
        clock: Callable[[], float] = time.time,
        reserve: bool = False,
    ) -> None:
        self.store = store
        # Take each request's worst case from its key's token buckets at admission (``quota``).
        self.reserve_tokens = reserve
        self.metrics = metrics
        self.quotas = quotas if quotas is not None else TokenQuotas(clock)
        self.flush_s = flush_s
        self.retention_s = retention_days * 86400.0
        self.max_pending = max_pending
        self._clock = clock
        self._pending: dict[UsageSlot, HourUsage] = {}
        self._failing = False
        self._stop = asyncio.Event()
        self.dropped = 0
        self.metrics.pending.set_function(lambda: len(self._pending))

    # -- request path ----------------------------------------------------------------------------

    def admit(self, key: KeyRecord) -> LimitExceeded | None:
        refused = self.quotas.check(key)
        if refused is not None:
            self.metrics.children(key.id)[4].inc()
        return refused

    def reserve(self, key: KeyRecord, facts: RequestFacts | None) -> int | LimitExceeded:
        """With reservation on, the tokens taken from the key's buckets for this request (its
        worst case; what is left when it has no bound), or the refusal; 0 otherwise."""
        if not self.reserve_tokens:
            return 0
        tokens = facts.reservation() if facts is not None else None
        taken = self.quotas.reserve(key, tokens)
        if isinstance(taken, LimitExceeded):
            self.metrics.children(key.id)[4].inc()
        return taken

    def record(
        self, key: KeyRecord, status: int, usage: Usage, duration_s: float, reserved: int = 0,
        model: str = "",
    ) -> None:
        """Count one finished request of ``key`` on ``model`` (the served name of the engine that
        took it, ``metrics``' bounded label)."""
        error = status >= 400
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        c_prompt, c_completion, c_ok, c_err, _ = self.metrics.children(key.id)
        (c_err if error else c_ok).inc()
        if prompt:
            c_prompt.inc(prompt)
        if completion:
            c_completion.inc(completion)
        self.quotas.settle(key, reserved, prompt + completion)
        slot: UsageSlot = (key.id, model, hour_of(self._clock()))
        row = self._pending.get(slot)
        if row is None:
            if len(self._pending) >= self.max_pending:
                self._drop(1)
                return
            row = self._pending[slot] = HourUsage()
        row.requests += 1
        row.errors += error
        row.prompt_tokens += prompt
        row.completion_tokens += completion
        row.duration_s += duration_s

    def _drop(self, requests: int) -> None:
        if self.dropped == 0:
            log.error("usage of %d request(s) lost: %d key x hour sums are waiting for the usage store "
                      "%s (limit %d); see appliance_gateway_usage_dropped_total",
                      requests, len(self._pending), self.store.path, self.max_pending)
        self.dropped += requests
        self.metrics.dropped.inc(requests)

    # -- the writer ------------------------------------------------------------------------------

    def restore(self) -> None:
        """Blocking, at start-up: the quota levels the last run saved."""
        try:
            self.quotas.restore(self.store.quota_states())
        except UsageStoreError as exc:
            log.warning("token quota levels not restored (%s): every bucket starts full", exc)

    async def flush(self) -> bool:
        """Write what is pending (the write in a worker thread). True if written or nothing to do.
        The pending sums are taken and merged back on the event loop, the only thread that
        records: a request ending during the write lands in the next batch, never in a lost one."""
        if not self._pending and not self.quotas.dirty and not self._failing:
            return True  # an idle gateway does not touch the disk
        batch, self._pending = self._pending, {}
        quotas = self.quotas.snapshot()
        try:
            await asyncio.to_thread(
                self.store.write, batch, quotas, prune_before=self._clock() - self.retention_s
            )
        except UsageStoreError as exc:
            self.metrics.store_errors.inc()
            self._merge_back(batch)
            if not self._failing:
                self._failing = True
                log.error("usage store write failed, keeping %d sums in memory (at most %d): %s",
                          len(self._pending), self.max_pending, exc)
            return False
        if self._failing:
            self._failing = False
            log.warning("usage store %s writable again", self.store.path)
        return True

    def _merge_back(self, batch: dict[UsageSlot, HourUsage]) -> None:
        # Requests recorded while the write ran are in the new dict; the old sums join them.
        for slot, usage in batch.items():
            row = self._pending.get(slot)
            if row is not None:
                row.add(usage)
            elif len(self._pending) < self.max_pending:
                self._pending[slot] = usage
            else:
                self._drop(usage.requests)

    async def run_writer(self) -> None:
        """Flush every ``flush_s`` until ``close``. Never cancelled mid-write: a cancelled
        ``to_thread`` may never run, and the batch it held would be lost."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.flush_s)
            await self.flush()

    async def close(self, writer: asyncio.Task[None] | None) -> None:
        """Stop the writer after its current flush, then write what is left."""
        self._stop.set()
        if writer is not None:
            await writer
        await self.flush()
