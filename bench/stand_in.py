#!/usr/bin/env python3
"""The summary that follows a stand-in digest: does a fact the digest cut reach the
summariser, and at what cost? Several binaries, in interleaved rounds of one run.

A review session in chat (each turn a draft of about 800 tokens and a reply; turn 3's
draft holds a planted fact in its middle, which the digest, cutting long messages to
their ends, leaves out) against bench/events.py's mock upstream (20,000 tokens at
3 bytes a token, a slow summariser), the window learned from the upstream's refusal: the
refused turn takes the digest at once (`summary=fallback`). Then, in two scenarios:

- appendix: the next turn brings an appendix of about 8,000 tokens, far more than the
  conversation's growth said a turn would be, so nothing was prepared and the event
  compacts in the request's path; then 3 ordinary turns;
- regular: 12 ordinary turns, whose event was prepared in the background.

The summariser shares the upstream's window (no `summarizer.context_window`), so a
summary made from the client's own messages comes in chunks. Figures per binary: the
event's answer time (appendix), summariser calls and the bytes of their messages after
the refused turn, whether the planted fact was in any of them, the later turns resumed
from an LLM summary, and the slowest later turn. Counts of "engine plan" lines in the
proxy's log are given too: 0 unless the binary was built to log each plan.

Only the standard library. Usage:

    python3 bench/stand_in.py [--rounds N] NAME=BINARY...
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import events  # noqa: E402  (the mock upstream and the proxy's start, shared)

PLANTED = "The release codename is HERON-7731."
WINDOW = 20_000
SUMMARY_DELAY = 0.5
THINK = 0.35


class Mock(events.Mock):
    """events.py's mock, keeping the messages of every summariser call."""

    def __init__(self, *args):
        super().__init__(*args)
        self.summary_requests = []

    def handle(self, body):
        messages = body.get("messages", [])
        if events.is_summary_call(messages):
            with self.lock:
                self.summary_requests.append(json.dumps(messages))
        return super().handle(body)


def draft(n):
    paragraph = f"Paragraph {n}: the reviewer's notes on section {n} of the draft. "
    if n == 3:
        return f"Review this, briefly.\n{paragraph * 18}{PLANTED} {paragraph * 18}"
    return f"Review this, briefly.\n{paragraph * 36}"


def reply(n):
    return f"Section {n} reads well; two sentences could go. " * 12


def post(port, messages):
    body = json.dumps({"model": "reviewer", "messages": messages}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
        headers={"content-type": "application/json", "authorization": "Bearer k"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()
        return answer.headers.get("x-compaction", ""), time.monotonic() - started


def turn(port, history, content, n):
    history.append({"role": "user", "content": content})
    x, took = post(port, history)
    history.append({"role": "assistant", "content": reply(n)})
    time.sleep(THINK)
    return x, took


def measure(binary, scenario):
    mock = Mock(WINDOW, 3, SUMMARY_DELAY, "openai")
    workdir = tempfile.mkdtemp(prefix="stand-in-bench-")
    proxy, port = events.start_proxy(binary, mock.port, None, workdir)
    row = {}
    try:
        history = [{"role": "system", "content": "You review drafts."}]
        for n in range(60):
            x, _ = turn(port, history, draft(n), n)
            if "trigger=error" in x:
                row["refused_turn"] = n
                break
        first = len(mock.summary_requests)
        later = 12
        if scenario == "appendix":
            appendix = "Appendix: the figures of the draft, one per section, in order. " * 380
            x, took = turn(port, history, f"Review the appendix.\n{appendix}", 99)
            row["event"] = re.sub(r"; (attempts|messages|tokens|window|output)=[^;]*", "", x)
            row["event_ms"] = round(took * 1000)
            later = 3
        xs, times = [], []
        for n in range(100, 100 + later):
            x, took = turn(port, history, draft(n), n)
            xs.append(x)
            times.append(took)
        # A preparation still running is counted with the session it belongs to.
        time.sleep(SUMMARY_DELAY + 0.5)
        calls = mock.summary_requests[first:]
        row["summariser_calls"] = len(calls)
        row["summariser_kb"] = round(sum(len(c) for c in calls) / 1024, 1)
        row["fact_reached"] = any(PLANTED in c for c in calls)
        row["later_from_llm"] = sum("summary=llm" in x or "summary=cache" in x for x in xs)
        row["later_turns"] = later
        row["slowest_later_ms"] = round(max(times) * 1000)
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        mock.close()
    with open(os.path.join(workdir, "proxy.log")) as f:
        row["engine_plans"] = f.read().count("engine plan")
    shutil.rmtree(workdir, ignore_errors=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each binary once a round")
    parser.add_argument("binaries", nargs="+", metavar="NAME=BINARY")
    args = parser.parse_args()
    binaries = [b.split("=", 1) for b in args.binaries]
    for name, path in binaries:
        if not os.access(path, os.X_OK):
            raise SystemExit(f"{name}={path}: not an executable file")
    print("| scenario | round | binary | refused turn | event | event ms | summariser calls | "
          "their KB | fact reached | later turns from an LLM summary | slowest later ms | engine plans |")
    print("| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for scenario in ("appendix", "regular"):
        for r in range(args.rounds):
            # Interleaved, the order turned each round.
            for name, path in (binaries if r % 2 == 0 else binaries[::-1]):
                row = measure(path, scenario)
                print(json.dumps({"scenario": scenario, "round": r, "binary": name, **row}), file=sys.stderr)
                print(f"| {scenario} | {r} | {name} | {row.get('refused_turn')} | {row.get('event', '-')} | "
                      f"{row.get('event_ms', '-')} | {row['summariser_calls']} | {row['summariser_kb']} | "
                      f"{'yes' if row['fact_reached'] else 'no'} | {row['later_from_llm']} of {row['later_turns']} | "
                      f"{row['slowest_later_ms']} | {row['engine_plans']} |", flush=True)


if __name__ == "__main__":
    main()
