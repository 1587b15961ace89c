#!/usr/bin/env python3
"""switch_load.py URL MODEL OUT.json --key-file F --stop-file S [--clients 4] [--max-s 300]

A steady load of short chat completions through the gateway while the engine is switched
(scripts/gpu_h200/samecard.sh). Standard library only (it runs on the device image). Each of
`--clients` threads sends one request after another (max_tokens 16, greedy) until the stop file
exists or `--max-s` has passed; every request is one sample [start (wall-clock s, as the launch
records), seconds, HTTP status or null when no answer came]. The client key is read from a file,
never from argv or the environment. Writes OUT.json: the samples and the totals (requests, failed,
longest); appliance/evaluation/samecard_switch.py judges them against the launch records.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request


def one(url: str, key: str, body: bytes, timeout_s: float) -> tuple[int | None, str | None]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
            return resp.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:200]
    except (OSError, ValueError) as exc:
        return None, str(exc)[:200]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--key-file", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-s", type=float, default=300.0)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    args = ap.parse_args()
    with open(args.key_file) as fh:
        key = fh.read().strip()
    body = json.dumps({"model": args.model, "max_tokens": 16, "temperature": 0,
                       "messages": [{"role": "user", "content": "What is the capital of France?"}]}).encode()
    samples: list[list[object]] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + args.max_s

    def worker() -> None:
        while time.monotonic() < deadline and not os.path.exists(args.stop_file):
            start, t = time.time(), time.monotonic()
            status, error = one(args.url, key, body, args.timeout_s)
            with lock:
                samples.append([round(start, 4), round(time.monotonic() - t, 4), status])
                if error is not None and len(errors) < 20:
                    errors.append(f"{status}: {error}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    failed = [s for s in samples if s[2] != 200]
    longest = max((float(s[1]) for s in samples), default=None)  # type: ignore[arg-type]
    out = {"url": args.url, "model": args.model, "clients": args.clients, "requests": len(samples),
           "failed": len(failed), "longest_s": longest, "errors": errors, "samples": samples}
    with open(args.out, "w") as fh:
        json.dump(out, fh)
    print(json.dumps({k: out[k] for k in ("requests", "failed", "longest_s")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
