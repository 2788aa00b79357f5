#!/usr/bin/env python3
"""Times Hermes Agent's ContextCompressor.compress() on the conversations that
examples/bench_engine.rs wrote, with the summary model unavailable, so that it takes its
static fallback (the reference for compaction-proxy's deterministic compaction).

    python hermes_compress.py [--repeat 5] session-10k.json session-128k.json ...

Runs in the venv where bench/peers.sh installed hermes-agent. Prints a markdown row and
a `RESULT impl=hermes ...` line per file (milliseconds, medians of --repeat runs).

How the summariser is made unavailable: sockets refuse to connect in this process, and
HERMES_HOME points at an empty directory, so no provider is configured. The first call
finds that out itself (its time is reported as first_ms); Hermes then sets its summary
cooldown, which every timed call starts with, exactly as it would on the next
compaction of a session without a summary model. Each timed call gets a fresh
compressor and a fresh deep copy of the messages, neither of which is timed.
"""

import argparse
import copy
import json
import os
import re
import statistics
import sys
import time

import hermes_offline  # beside this script

hermes_offline.sandbox("bench")

from agent.context_compressor import ContextCompressor  # noqa: E402
from agent.model_metadata import estimate_messages_tokens_rough  # noqa: E402


def compressor(est_tokens, cooldown):
    # Context length = its own estimate of the conversation: at the default 50 %
    # threshold it aims at about half, like compaction-proxy's run.
    c = ContextCompressor(model="gpt-4o", quiet_mode=True, config_context_length=est_tokens)
    if cooldown:
        c._summary_failure_cooldown_until = time.monotonic() + 1e9
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    print("| conversation | est. tokens (chars/4) | compress ms | first call ms | messages | est. tokens after | static fallback |")
    print("|---|---|---|---|---|---|---|")
    lines = []
    for path in args.files:
        m = re.search(r"session-([^.]+)\.json$", path)
        size = m.group(1) if m else os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            messages = json.load(f)["messages"]
        est = estimate_messages_tokens_rough(messages)

        # First call: Hermes tries to reach a summary model, fails, and falls back.
        c = compressor(est, cooldown=False)
        work = copy.deepcopy(messages)
        t = time.perf_counter()
        out = c.compress(work)
        first_ms = (time.perf_counter() - t) * 1e3
        fallback = bool(getattr(c, "_last_summary_fallback_used", False))

        samples = []
        for _ in range(args.repeat):
            c = compressor(est, cooldown=True)
            work = copy.deepcopy(messages)
            t = time.perf_counter()
            out = c.compress(work)
            samples.append((time.perf_counter() - t) * 1e3)
            fallback = fallback and bool(getattr(c, "_last_summary_fallback_used", False))
        samples.sort()
        after = estimate_messages_tokens_rough(out)
        med = statistics.median(samples)
        print(f"| {size} | {est} | {med:.2f} [{samples[0]:.2f}..{samples[-1]:.2f}] | {first_ms:.2f} | "
              f"{len(messages)} -> {len(out)} | {after} | {fallback} |")
        lines.append(
            f"RESULT impl=hermes size={size} est_tokens={est} compress_ms={med:.3f} "
            f"compress_min_ms={samples[0]:.3f} compress_max_ms={samples[-1]:.3f} samples={len(samples)} "
            f"first_ms={first_ms:.3f} messages_before={len(messages)} messages_after={len(out)} "
            f"est_tokens_after={after} fallback_used={fallback}"
        )
        sys.stdout.flush()
    print()
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
