"""The gateway: an authenticated, byte-for-byte streaming proxy in front of the engine.

A separate process from the controller (a controller restart must not drop a stream). Modules by
role: ``keystore`` (hashed keys in SQLite), ``auth`` (key cache, admin token), ``limits`` (rpm and
concurrency per key), ``slot`` (which upstream, drain), ``proxy`` (the hot path), ``admin`` (the
controller's handle), ``app`` (the ASGI app), ``server`` (uvicorn with uvloop + httptools),
``control`` (the controller's async client), ``metrics`` (metric names for dashboards),
``embedded`` (serve in the current event loop, for tests).
"""
