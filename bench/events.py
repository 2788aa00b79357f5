#!/usr/bin/env python3
"""Compaction as rare, prepared events (issue 14), measured.

Drives two scripted sessions through a release build of the proxy, against a mock
upstream with a 32k-token window whose summariser calls take 5 s, once with the proxy's
defaults ("after") and once configured as it was before compactions were events
(`low_water = threshold`, nothing prepared: "before"):

- a 40-turn tool-heavy agent session (two tool outputs of a few KB per turn);
- a 100-turn chat session (prose only).

For each it reports the share of consecutive accepted upstream requests whose messages
byte-extend the previous request's (what an upstream prompt cache needs), the summariser
calls, the time to the answer of the turns that crossed the threshold beside the others,
and the tokens sent upstream. Only the standard library; the proxy binary is
target/release/compaction-proxy (build it first). Usage:

    cargo build --release && python3 bench/events.py [--quick]
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROXY = os.environ.get("PROXY_BIN", os.path.join(ROOT, "target/release/compaction-proxy"))
WINDOW = 32_000
SUMMARY_DELAY = 5.0
SUMMARY_PROMPT = "You are writing a checkpoint"


def tokens(body):
    """The mock's count: about four characters a token, as o200k counts English."""
    return len(json.dumps(body.get("messages", []))) // 4


class Upstream(BaseHTTPRequestHandler):
    log = []
    summaries = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        messages = body.get("messages", [])
        if messages and str(messages[0].get("content", "")).startswith(SUMMARY_PROMPT):
            with Upstream.lock:
                Upstream.summaries += 1
            time.sleep(SUMMARY_DELAY)
            return self.answer(body, "## Active Task\nBench summary.\n\n## Goal\nFinish the work.")
        count = tokens(body)
        if count + (body.get("max_tokens") or 0) > WINDOW:
            error = {"error": {"message": f"This model's maximum context length is {WINDOW} tokens. "
                               f"However, your messages resulted in {count} tokens.",
                               "type": "invalid_request_error", "code": "context_length_exceeded"}}
            return self.send_json(400, error)
        with Upstream.lock:
            Upstream.log.append((json.dumps(messages), count))
        self.answer(body, f"Done with turn; saw {len(messages)} messages.")

    def answer(self, body, text):
        self.send_json(200, {"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": tokens(body), "completion_tokens": 10}})

    def send_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_proxy(upstream_port, extra):
    port = free_port()
    config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    config.write(f'listen = "127.0.0.1:{port}"\n[upstream]\nbase_url = "http://127.0.0.1:{upstream_port}/v1"\n'
                 f'{extra}\n[[models]]\nmatch = "*"\ncontext_window = {WINDOW}\n')
    config.close()
    proc = subprocess.Popen([PROXY, "--config", config.name], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            os.unlink(config.name)
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the proxy did not start")


def post(port, messages):
    body = json.dumps({"model": "bench-model", "messages": messages}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json", "authorization": "Bearer k"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
        took = time.monotonic() - started
        return answer["choices"][0]["message"]["content"], response.headers.get("x-compaction", ""), took


def tool_turn(n):
    read, run = f"call_{n}_r", f"call_{n}_t"
    source = "".join(f"    let value_{i} = compute_{n}({i}); // line {i}\n" for i in range(50))
    log = f"error[E0382]: borrow of moved value `v{n}`\n" + "   Compiling app v0.1.0 (/work/app)\n" * 40
    return [
        {"role": "user", "content": f"Turn {n}: test_module_{n} fails; fix src/module_{n}.rs."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": read, "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/module_{n}.rs"})}},
            {"id": run, "type": "function", "function": {"name": "run", "arguments": json.dumps({"cmd": f"cargo test module_{n}"})}}]},
        {"role": "tool", "tool_call_id": read, "content": source},
        {"role": "tool", "tool_call_id": run, "content": log},
    ]


def chat_turn(n):
    draft = f"Paragraph {n} of my draft, for you to review: " + "the argument turns on how the evidence is read, and why. " * 40
    return [{"role": "user", "content": draft}]


def session(port, turns, make, think):
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    results = []
    for n in range(turns):
        messages.extend(make(n))
        text, x, took = post(port, messages)
        results.append((x, took))
        messages.append({"role": "assistant", "content": text})
        time.sleep(think)
    return results


def measure(name, extra, turns, make, think):
    Upstream.log, Upstream.summaries = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy, port = start_proxy(server.server_address[1], extra)
    try:
        results = session(port, turns, make, think)
        # A preparation still running is counted with the session it belongs to.
        time.sleep(0.5)
    finally:
        proxy.terminate()
        proxy.wait()
        server.shutdown()
    log = Upstream.log
    pairs = [log[i + 1][0].startswith(log[i][0][:-1]) for i in range(len(log) - 1)]
    events = [i + 1 for i, grew in enumerate(pairs) if not grew]
    event_times = [results[i][1] for i in events if i < len(results)]
    other_times = [t for i, (_, t) in enumerate(results) if i not in events]
    return {
        "name": name,
        "extend": sum(pairs) / max(len(pairs), 1),
        "events": len(events),
        "summaries": Upstream.summaries,
        "event_p50": statistics.median(event_times) if event_times else 0.0,
        "other_p50": statistics.median(other_times) if other_times else 0.0,
        "tokens": sum(count for _, count in log),
        "turns": turns,
    }


def main():
    quick = "--quick" in sys.argv
    configs = [
        ("before", "[compaction]\nlow_water = 0.9\nprepare_concurrency = 0\n"),
        ("after", ""),
    ]
    sessions = [
        ("40-turn tool session", 12 if quick else 40, tool_turn, 2.0),
        ("100-turn chat session", 20 if quick else 100, chat_turn, 1.0),
    ]
    rows = []
    for label, turns, make, think in sessions:
        for name, extra in configs:
            row = measure(name, extra, turns, make, think)
            row["session"] = label
            rows.append(row)
            print(f"{label} / {name}: {row}", file=sys.stderr)
    print("| session | proxy | requests extending the previous | compaction events | summariser calls "
          "| answer time, event turns (p50) | answer time, other turns (p50) | tokens sent upstream |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['session']} | {r['name']} | {r['extend']:.0%} | {r['events']} | {r['summaries']} "
              f"| {r['event_p50'] * 1000:.0f} ms | {r['other_p50'] * 1000:.0f} ms | {r['tokens']:,} |")


if __name__ == "__main__":
    main()
