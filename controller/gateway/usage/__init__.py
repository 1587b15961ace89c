"""The gateway's usage wing: tokens per key as the engine counts them, on and off the request path.

Modules by role:

- on the request path: ``request`` (what a request body says for metering, read as the engine reads
  it: stream, output bounds per route), ``meter`` (the engine's ``usage`` object read from a body or
  an event stream; the gateway never tokenizes), ``quota`` (tokens per minute and per day: two token
  buckets per key), ``ratelimit_headers`` (the ``x-ratelimit-*`` headers of a key with limits);
- summing and keeping: ``accounting`` (usage summed per key per hour in memory, counted, charged to
  the quotas, handed to the store off the request path), ``store`` (usage per key per hour and the
  quota levels, in ``usage.sqlite3``), ``metrics`` (the usage and quota metrics in the gateway's
  registry);
- reading back: ``report`` (time ranges, keys, rows and totals for ``appliance usage`` and the
  controller's ``GET /usage``).
"""
