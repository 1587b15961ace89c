"""The gateway: an authenticated, byte-for-byte streaming proxy in front of the engine.

A separate process from the controller (a controller restart must not drop a stream). Modules by
role: ``keystore`` (hashed keys in SQLite), ``auth`` (key cache, admin token), ``limits`` (rpm and
concurrency per key), ``slot`` (which upstream, drain), ``proxy`` (the hot path), ``jsonbody`` (the
top-level model of a JSON body, without parsing the rest), ``admin`` (the controller's handle),
``app`` (the ASGI app), ``protocol`` (uvicorn's httptools protocol with the limits a client meets
before auth), ``server`` (uvicorn with uvloop + the guarded protocol),
``control`` (the controller's async client), ``metrics`` (metric names for dashboards),
``embedded`` (serve in the current event loop, for tests), ``usage_request`` (what a request body
says for metering: stream as the engine reads it, output bounds per route), ``ratelimit_headers``
(the ``x-ratelimit-*`` headers of a key with limits).
"""
