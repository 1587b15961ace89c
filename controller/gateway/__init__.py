"""The gateway: an authenticated, byte-for-byte streaming proxy in front of the engine.

A separate process from the controller (a controller restart must not drop a stream). The core, by
role:

- serving: ``server`` (uvicorn with uvloop + the guarded protocol), ``protocol`` (uvicorn's httptools
  protocol with the limits a client meets before auth), ``app`` (the ASGI app), ``asgi`` (its bare
  helpers), ``config`` (what the process is told at start-up), ``gc_pauses`` (the collector settled
  after start-up), ``embedded`` (serve in the current event loop, for tests);
- the request path: ``proxy`` (the hot path), ``jsonbody`` (the top-level model of a JSON body,
  without parsing the rest), ``upstream_client`` (pooled HTTP/1.1 to the engine), ``field_check``
  (what it refuses to write), ``hop_headers`` (what is not forwarded, either way), ``slot`` (which
  upstream, drain);
- keys and limits: ``keystore`` (hashed keys in SQLite), ``auth`` (key cache, admin token),
  ``limits`` (rpm and concurrency per key);
- the controller's side: ``admin`` (the admin surface on the control listener), ``control`` (the
  controller's async client for it); ``metrics`` (metric names for dashboards).

Two wings beside the core, each with its own map: ``usage/`` (token usage per key as the engine
counts it, token quotas, the usage store and reports, the ``x-ratelimit-*`` headers) and ``hold/``
(requests held across a planned engine switch). The core's ``proxy``, ``app``, ``admin``, ``control``
and ``metrics`` use the wings; the wings use the core's keys, limits, metrics, asgi and slot, and not
each other.
"""
