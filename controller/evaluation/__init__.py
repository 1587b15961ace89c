"""Choosing a recipe on evidence (DOMAIN §7), the effectful half: benches, comparisons and fingerprints run
against the engine through the controller; the pure rules are in `appliance/evaluation/`.

Modules by role:

- ``accuracy_run``: Scoring one arm on the offline accuracy sets (appliance/evaluation/accuracy.py) with
  the bench's own client: greedy chat completions that stop naturally, one at a time (a fixed batch
  composition, so the two arms see the same schedule; DOMAIN §7: eager's reproducibility holds for a fixed
  batch). A failed request scores 0 and is recorded with its error.
- ``bench``: `appliance bench`: the tiered benchmark and the single-stream protocol against one engine.
- ``bench_key``: The running launch's engine API key, for a bench/fingerprint/compare run from the CLI.
- ``choice_seam``: The real side of a choice: the survey of every recipe of the host's platform (lint →
  admission → render), the arms' cost from the launch history, and the gate through the supervisor.
- ``choice_store``: Choice records (`appliance choose`), in the launch store's SQLite file; one runs at a
  time.
- ``choose``: `appliance choose` / `POST /choices`: the tournament's runner over a declared seam
  (`ChoiceSeam`), saved after every step, resumed after a restart, back to the serving recipe at the end.
- ``cards``: What this host can read about the cards a recipe runs on: names and power caps.
- ``client``: The one benchmark client (DOMAIN §7: "always the same client"): aiohttp against the engine's
  OpenAI-compatible API, directly or through the gateway with a key.
- ``compare``: `appliance compare BASELINE CANDIDATE`: switch the engine through the controller, bench
  each arm warm with the same client and prompts, and apply the gate (appliance/evaluation/gate.py).
- ``controls``: The two ways a compare (or a bench) reaches the engine's controller.
- ``fingerprint``: `appliance fingerprint`: measure a recipe's reproducibility on the running engine.
- ``proof``: Kernel-path and deployment proof, gathered at ready and kept with the launch (DOMAIN §7).
- ``router``: Admin API routes for benchmarks, comparisons and fingerprints (included by
  controller/api/app.py).
- ``smoke``: The smoke step of a compare: the first 8–16K request alone, before anything is measured.
- ``store``: Benchmark, comparison and fingerprint records, in the launch store's SQLite file.
"""
