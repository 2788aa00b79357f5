#!/usr/bin/env python3
"""Runs one peer compressor over a session's requests, for bench/economy.py.

    PYTHON bench/economy_peers.py NAME < requests.json > result.json

PYTHON is an interpreter with the peer installed. stdin: a JSON list of requests, each a
list of chat messages. stdout: {"version", "messages": [the messages each request would
send upstream], "seconds": [the time each compression took]}. Each request is compressed
on its own, as a proxy in front of the upstream would see it, with the peer's setting for
agent sessions.
"""

import json
import os
import sys
import time
from importlib import metadata

MODEL = "gpt-4o"


def llmtrim_peer():
    import llmtrim

    def run(messages):
        body = json.dumps({"model": MODEL, "messages": messages})
        out = llmtrim.compress(body, llmtrim.Provider.OPEN_AI, "agent")
        return json.loads(out.request_json)["messages"]

    return metadata.version("llmtrim"), run


def kompact_peer():
    # Kompact's proxy runs this pipeline on each request before forwarding it
    # (kompact/proxy/server.py): parse, transforms, serialise, with its default config.
    from kompact.config import KompactConfig
    from kompact.parser.messages import parse_request, serialize_request
    from kompact.transforms.pipeline import run as run_pipeline
    from kompact.types import Provider

    config = KompactConfig()

    def run(messages):
        body = {"model": MODEL, "messages": messages}
        result = run_pipeline(parse_request(body, Provider.OPENAI), config)
        return serialize_request(result.request)["messages"]

    return metadata.version("kompact"), run


def headroom_peer():
    # The library call its README gives: compress(messages, model=...), offline.
    os.environ.setdefault("HEADROOM_OFFLINE", "1")
    from headroom import compress

    def run(messages):
        return compress(messages, model=MODEL).messages

    return metadata.version("headroom-ai"), run


PEERS = {"llmtrim": llmtrim_peer, "kompact": kompact_peer, "headroom": headroom_peer}


def main():
    name = sys.argv[1]
    version, run = PEERS[name]()
    requests = json.load(sys.stdin)
    messages, seconds = [], []
    for request in requests:
        started = time.perf_counter()
        messages.append(run(request))
        seconds.append(time.perf_counter() - started)
    json.dump({"version": version, "messages": messages, "seconds": seconds}, sys.stdout)


if __name__ == "__main__":
    main()
