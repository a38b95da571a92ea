#!/usr/bin/env python3
"""HTTP/2 load with httpx (python h2 underneath): N clients, one h2c
prior-knowledge connection each, M concurrent streams per client.

Bounded in count and time. Prints one JSON line: sent, ok, failed and the
failures by message, then exits 0 (the Rust test judges the numbers).
Stops early when the file named by --stop exists.

usage: httpx_load.py URL --clients 6 --streams 6 --max-requests 6000
                     --max-seconds 60 --stop FILE
"""
import argparse
import asyncio
import json
import os
import sys
import time

import httpx


async def stream_loop(client, url, state, deadline, args):
    while (
        state["sent"] < args.max_requests
        and time.monotonic() < deadline
        and not os.path.exists(args.stop)
    ):
        state["sent"] += 1
        try:
            resp = await client.get(url)
            if resp.status_code == 200:
                state["ok"] += 1
            else:
                key = f"status {resp.status_code}"
                state["errors"][key] = state["errors"].get(key, 0) + 1
        except Exception as exc:  # every failure is counted, never hidden
            key = f"{type(exc).__name__}: {exc}"[:200]
            if os.environ.get("KUBEGRACE_LOAD_TRACE"):
                import traceback
                # The httpcore exception under httpx's mapping.
                inner = exc.__cause__ or exc.__context__ or exc
                while inner.__context__ is not None and len(key) < 400:
                    frames = traceback.extract_tb(inner.__traceback__)
                    key += " @ " + " < ".join(f"{f.name}:{f.lineno}" for f in reversed(frames[-4:]))
                    inner = inner.__context__
                tb = inner.__traceback__
                while tb is not None:
                    if "stream_id" in tb.tb_frame.f_locals:
                        key += f" [stream {tb.tb_frame.f_locals['stream_id']}]"
                        break
                    tb = tb.tb_next
                frames = traceback.extract_tb(inner.__traceback__)
                key += " @@ " + f"{type(inner).__name__} " + " < ".join(f"{f.name}:{f.lineno}" for f in reversed(frames[-5:]))
            state["errors"][key] = state["errors"].get(key, 0) + 1


async def client_loop(url, state, deadline, args):
    # One connection per client, like a service with one pooled channel.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    timeout = httpx.Timeout(10.0)
    async with httpx.AsyncClient(
        http1=False, http2=True, limits=limits, timeout=timeout
    ) as client:
        await asyncio.gather(
            *(stream_loop(client, url, state, deadline, args) for _ in range(args.streams))
        )


def trace_goaway():
    """Debug aid: print the event batches around a GOAWAY to stderr."""
    import collections
    import h2.events
    from httpcore._async import http2 as hc

    orig = hc.AsyncHTTP2Connection._read_incoming_data
    recent = collections.defaultdict(lambda: collections.deque(maxlen=4))

    async def traced(self, request):
        events = await orig(self, request)
        desc = [
            f"{type(e).__name__}({getattr(e, 'stream_id', '')}"
            f"{',last=' + str(e.last_stream_id) if isinstance(e, h2.events.ConnectionTerminated) else ''})"
            for e in events
        ]
        recent[id(self)].append(f"{time.monotonic():.3f} {desc}")
        if any(isinstance(e, h2.events.ConnectionTerminated) for e in events):
            print(f"GOAWAY batch on {id(self)}:", *recent[id(self)], sep="\n  ", file=sys.stderr)
        return events

    hc.AsyncHTTP2Connection._read_incoming_data = traced


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--streams", type=int, default=6)
    p.add_argument("--max-requests", type=int, default=6000)
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--stop", default="/nonexistent")
    args = p.parse_args()
    if os.environ.get("KUBEGRACE_LOAD_TRACE"):
        trace_goaway()
    state = {"sent": 0, "ok": 0, "errors": {}}
    deadline = time.monotonic() + args.max_seconds
    await asyncio.gather(
        *(client_loop(args.url, state, deadline, args) for _ in range(args.clients))
    )
    failed = sum(state["errors"].values())
    print(
        json.dumps(
            {
                "sent": state["sent"],
                "ok": state["ok"],
                "failed": failed,
                "errors": state["errors"],
                "httpx": httpx.__version__,
            }
        )
    )
    sys.stdout.flush()


asyncio.run(main())
