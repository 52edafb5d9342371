"""Load test: N concurrent streaming clients, each sending a few requests, against a running
Perch server on loopback. Every request must either stream to [DONE] or get a clean 429;
anything else (5xx, reset connection, malformed stream) fails.

Usage: load_test.py BASE_URL MODEL [CLIENTS] [REQUESTS_PER_CLIENT]
Prints one JSON line of counts and timings.
"""

import asyncio
import json
import sys
import time

import httpx

base_url, model = sys.argv[1], sys.argv[2]
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 16
per_client = int(sys.argv[4]) if len(sys.argv) > 4 else 3


async def one(http, i, j, counts):
    body = {"model": model, "messages": [{"role": "user", "content": f"client {i} request {j}"}],
            "max_tokens": 48, "temperature": 0.8, "seed": i * 100 + j, "stream": True}
    async with http.stream("POST", f"{base_url}/chat/completions", json=body) as r:
        if r.status_code == 429:
            await r.aread()
            assert r.headers.get("retry-after"), "429 without Retry-After"
            assert "error" in json.loads(r.text if hasattr(r, "text") else "{}")
            counts["busy"] += 1
            return
        if r.status_code != 200:
            raise AssertionError(f"status {r.status_code}: {(await r.aread())[:200]}")
        done = False
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
        assert done, "stream ended without [DONE]"
        counts["completed"] += 1


async def main():
    counts = {"completed": 0, "busy": 0}
    start = time.time()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        async def client(i):
            for j in range(per_client):
                await one(http, i, j, counts)
        await asyncio.gather(*(client(i) for i in range(clients)))
    counts["seconds"] = round(time.time() - start, 2)
    counts["requests"] = clients * per_client
    assert counts["completed"] + counts["busy"] == counts["requests"], counts
    print(json.dumps(counts))


asyncio.run(main())
