#!/usr/bin/env python3
"""decode_client.py URL MODEL LABEL OUT.json — a small measuring client for the H200 runs (docs/gpu-h200.md).

Standard library only (it runs on the device image). Against an OpenAI-compatible /v1/completions:
- TTFT and decode ms/token from streamed greedy completions (ignore_eos, 128 tokens; MEASURED.md: the
  small model ends at once otherwise): TTFT = first chunk, decode = (last − first) / (chunks − 1);
- reproducibility: the same greedy prompt 3× in series, then 4× at once (a batch): the sha256 of
  each text. Identical hashes within a server = reproducible across requests and batches; the
  hashes are compared across restarts afterwards (docs/gpu-h200.md).
"""

import hashlib
import json
import os
import sys
import threading
import time
import urllib.request

PROMPT = "The capital of France is"


def post(url, body, stream=False):
    headers = {"Content-Type": "application/json"}
    # Through the appliance's gateway (tp_acceptance.sh): a client key, from the environment only.
    if os.environ.get("DECODE_CLIENT_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["DECODE_CLIENT_KEY"]
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
    return urllib.request.urlopen(req, timeout=120)


def streamed(url, model, tokens=128):
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    t0 = time.perf_counter()
    stamps, text = [], []
    with post(url, body) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0].get("text", "")
            if piece:
                stamps.append(time.perf_counter() - t0)
                text.append(piece)
    n = len(stamps)
    return {"ttft_ms": round(stamps[0] * 1e3, 2) if n else None,
            "decode_ms_per_token": round((stamps[-1] - stamps[0]) / (n - 1) * 1e3, 3) if n > 1 else None,
            "chunks": n, "sha": hashlib.sha256("".join(text).encode()).hexdigest()[:16]}


def greedy(url, model, tokens=64):
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    with post(url, body) as r:
        text = json.loads(r.read())["choices"][0]["text"]
    return text


def main():
    url, model, label, out = sys.argv[1:5]
    res = {"label": label, "url": url, "runs": []}
    streamed(url, model, 16)  # warm-up, not counted
    for _ in range(5):
        res["runs"].append(streamed(url, model))
    decodes = sorted(r["decode_ms_per_token"] for r in res["runs"] if r["decode_ms_per_token"])
    ttfts = sorted(r["ttft_ms"] for r in res["runs"] if r["ttft_ms"])
    res["decode_ms_per_token_median"] = decodes[len(decodes) // 2] if decodes else None
    res["ttft_ms_median"] = ttfts[len(ttfts) // 2] if ttfts else None
    serial = [greedy(url, model) for _ in range(3)]
    batch = [None] * 4

    def one(i):
        batch[i] = greedy(url, model)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sha = lambda s: hashlib.sha256(s.encode()).hexdigest()[:16]  # noqa: E731
    res["serial_sha"] = [sha(t) for t in serial]
    res["batch_sha"] = [sha(t or "") for t in batch]
    res["same_across_requests"] = len(set(res["serial_sha"])) == 1
    res["same_in_batch_as_serial"] = set(res["batch_sha"]) == set(res["serial_sha"][:1])
    res["text_head"] = serial[0][:120]
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps({k: res[k] for k in ("label", "decode_ms_per_token_median", "ttft_ms_median",
                                          "same_across_requests", "same_in_batch_as_serial")}))
    print("   serial", res["serial_sha"], "batch", res["batch_sha"])


if __name__ == "__main__":
    main()
