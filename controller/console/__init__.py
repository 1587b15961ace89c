"""The operator console: server-rendered pages on the controller (routes/, one module per area).

Modules by role: ``auth`` (log-in: the admin token buys a session, the session a CSRF token),
``views`` (what the pages show, gathered from the driver, store, preflight and host history),
``bench_views`` (the Benchmarks pages), ``choice_views`` (the Choices pages: decision records, their
tables and per-tier charts), ``usage_views`` (the Keys page's usage), ``gpu_views`` (the
GPU health panel), ``load_views`` (the Now page's load panel: figures and sparklines), ``try_it`` (the
Now page's Try it box: one completion through the gateway with a pasted key), ``charts``
(plain SVG charts rendered on the server); ``routes/`` registers the
pages, one module per area (``login``, ``now``, ``recipes``, ``launches``, ``engine``,
``benchmarks``, ``choices``, ``memory``, ``keys``; ``pages`` holds what they share).
"""
