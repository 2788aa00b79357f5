#!/usr/bin/env python3
"""Economy mode (issue 43): a 30-turn tool session far below its window, economy off and on.

The session an agent makes fixing one bug: it reads the same three files again and again,
runs the same test suite (the same output until the one edit fixes the bug, then a near
copy of it), fetches one JSON document, greps; turn 16 edits src/app.py and turn 17 reads
the new text. Every request (one per turn) goes through the proxy to a mock upstream in
this process that records it. Per mode, over the 30 requests the upstream received:

- tokens sent: the sum of bytes/4 of each request's messages as JSON (events.py's count);
- prefix share: for each request after the first, its longest common prefix with the
  previous request, over its own size; the mean (events.py's "bytes repeated");
- tokens repeated (of sent): those prefixes over all bytes sent (the share of the
  session's input a prompt cache could read);
- previous reused: the same prefixes over the previous request's size; the mean (a request
  that only extends the previous one reuses all of it);
- requests extending the previous (no prefix change at all);
- latest outputs verbatim: requests whose last tool output is the client's, byte for byte;
- edit visible: requests after the edit that carry the edited file's new text whole and
  the edit's call;
- facts kept: of the facts planted in the outputs (an error line, paths, ids, numbers with
  units), those present in the last request;
- valid: requests whose tool calls are answered, in order, and whose roles alternate.

Only the standard library. Usage:

    python3 bench/economy.py [--binary PATH] [--age N] [--batch-tokens N] [--json FILE]

The table goes to stdout, progress to stderr.
"""

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BYTES_PER_TOKEN = 4


# --- the session ---------------------------------------------------------------------------


def source(rng, name, lines, version=0):
    """A Python module of `lines` lines; `version` 1 is the edited app.py."""
    out = [f'"""{name}: part of the orders service."""', "import json", "from decimal import Decimal", ""]
    for i in range(lines // 6):
        out += [f"def handle_{name}_{i}(order, amount):",
                f"    # step {i}: check the order's state before charging",
                f"    if order.state != 'open':",
                f"        raise OrderError('order %s is not open' % order.id)",
                f"    return charge(order, Decimal(amount) * {rng.randint(2, 9)})", ""]
    if version == 1:
        out[4 + 6 * 3 + 4] = "    return refund(order, Decimal(amount)) if amount < 0 else charge(order, amount)"
    return "\n".join(out) + "\n"


def pytest_output(passed):
    lines = ["============================= test session starts ==============================",
             "platform linux -- Python 3.12.3, pytest-8.3.2, pluggy-1.5.0",
             "rootdir: /srv/orders", "collected 42 items", ""]
    for i in range(42):
        status = "FAILED" if (i == 17 and not passed) else "PASSED"
        lines.append(f"tests/test_app.py::test_case_{i} {status} [{(i + 1) * 100 // 42:3d}%]")
    if not passed:
        lines += ["", "=================================== FAILURES ===================================",
                  "_________________________________ test_case_17 _________________________________",
                  "    def test_case_17():", "        order = make_order(amount=-25)",
                  ">       assert handle_app_3(order, -25).status == 402",
                  "E       AssertionError: assert 200 == 402",
                  "tests/test_app.py:88: AssertionError",
                  "=========================== short test summary info ============================",
                  "FAILED tests/test_app.py::test_case_17 - AssertionError: assert 200 == 402",
                  "========================= 1 failed, 41 passed in 0.84s ========================="]
    else:
        lines.append("============================== 42 passed in 0.81s ==============================")
    return "\n".join(lines) + "\n"


def orders_json(rng):
    items = [{"id": f"ord_{1000 + i}", "state": rng.choice(["open", "paid", "refunded"]),
              "amount": f"{rng.randint(5, 500)}.00 EUR", "customer": {"id": f"cus_{rng.randint(100, 999)}",
              "country": rng.choice(["DE", "FR", "NL"])}, "created_at": f"2026-11-{1 + i % 27:02d}T10:00:00Z"}
             for i in range(50)]
    return json.dumps({"object": "list", "total_count": 50, "request_id": "req_7f3a9c21", "data": items}, indent=2)


def grep_output():
    return "\n".join(f"src/app.py:{5 + 6 * i}:def handle_app_{i}(order, amount):" for i in range(20)) + "\n"


SCRIPT = ["read app", "read util", "test", "fetch", "read tests", "grep", "read app", "test", "read util",
          "grep", "read app", "test", "read tests", "test", "read app", "edit", "read app", "test",
          "read util", "grep", "read app", "test", "read tests", "read app", "test", "read util", "grep",
          "read app", "test", "read app"]
EDIT_TURN = SCRIPT.index("edit")


def session(seed, rounds=1):
    """The turns, (call name, arguments, output) each: the 30 of the script, then with
    `rounds` > 1 the script again as many more times, after the fix (its edit a test run)."""
    rng = random.Random(seed)
    files = {"app": source(random.Random(1), "app", 180), "util": source(rng, "util", 120),
             "tests": source(rng, "tests", 90)}
    edited = source(random.Random(1), "app", 180, version=1)
    doc = orders_json(rng)
    turns = []
    steps = SCRIPT + [s if s != "edit" else "test" for s in SCRIPT] * (rounds - 1)
    for n, step in enumerate(steps):
        after = n > EDIT_TURN
        if step.startswith("read"):
            key = step.split()[1]
            path = {"app": "src/app.py", "util": "src/util.py", "tests": "tests/test_app.py"}[key]
            text = edited if (key == "app" and after) else files[key]
            turns.append(("read_file", {"path": path}, text))
        elif step == "test":
            turns.append(("bash", {"command": "pytest -q tests/"}, pytest_output(after)))
        elif step == "fetch":
            turns.append(("fetch", {"url": "https://api.example.com/v1/orders?limit=50"}, doc))
        elif step == "grep":
            turns.append(("bash", {"command": "grep -n 'def handle' src/app.py"}, grep_output()))
        else:
            turns.append(("edit_file", {"path": "src/app.py", "old": "return charge(order, Decimal(amount) * 7)",
                                        "new": "return refund(order, Decimal(amount)) if amount < 0 else charge(order, amount)"},
                          "Edited src/app.py: 1 replacement"))
    return turns, edited


FACTS = ["AssertionError: assert 200 == 402", "tests/test_app.py:88", "req_7f3a9c21", "total_count",
         "0.84s", "42 passed in 0.81s", "ord_1000", "src/util.py", "refund(order, Decimal(amount))"]


def requests(turns):
    """The messages of each request: the history up to and including turn k's output."""
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools to read, run and edit."},
                {"role": "user", "content": "The refund test fails: make negative amounts refund. Keep the API."}]
    out = []
    for n, (name, args, output) in enumerate(turns):
        cid = f"call_{n:02d}"
        messages.append({"role": "assistant", "content": f"Step {n + 1}.", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": output})
        out.append([dict(m) for m in messages])
    return out


# --- the upstream and the proxy ------------------------------------------------------------


class Mock:
    def __init__(self):
        self.received = []
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                mock.received.append(body["messages"])
                data = json.dumps({"id": "c", "object": "chat.completion", "model": body.get("model"),
                                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_proxy(binary, upstream_port, compaction, workdir):
    port = free_port()
    config = os.path.join(workdir, "proxy.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\n[upstream]\nbase_url = "http://127.0.0.1:{upstream_port}/v1"\n'
                f'[cache]\nbackend = "memory"\n[[models]]\nmatch = "*"\ncontext_window = 200000\n'
                f'[compaction]\n{compaction}')
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(workdir, "state"), HOME=workdir)
    log = open(os.path.join(workdir, "proxy.log"), "w")
    proc = subprocess.Popen([binary, "--config", config], stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the proxy {binary} did not start")


def post(port, messages):
    body = json.dumps({"model": "bench-model", "messages": messages}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json", "authorization": "Bearer k"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:
        header = response.headers.get("x-compaction", "")
        response.read()
    return header, time.monotonic() - started


# --- the figures ---------------------------------------------------------------------------


def common_prefix(a, b):
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def valid(messages):
    """Tool calls answered in order right after their call; no two users or assistants in a row."""
    open_ids, previous = [], None
    for m in messages:
        role = m["role"]
        if open_ids and role != "tool":
            return False
        if role == "tool":
            if not open_ids or m.get("tool_call_id") != open_ids.pop(0):
                return False
        elif role in ("user", "assistant") and role == previous:
            return False
        if role == "assistant":
            open_ids = [c["id"] for c in m.get("tool_calls", [])]
        previous = role
    return not open_ids


def measure(binary, compaction, sent, edited):
    """The proxy with `compaction`'s settings between the session and the mock."""
    mock = Mock()
    workdir = tempfile.mkdtemp(prefix="economy-bench-")
    proxy, port = run_proxy(binary, mock.port, compaction, workdir)
    headers, times = [], []
    try:
        for messages in sent:
            header, took = post(port, messages)
            headers.append(header)
            times.append(took)
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        mock.close()
        shutil.rmtree(workdir, ignore_errors=True)
    row = figures(mock.received, sent, edited, times)
    row["economy_headers"] = sum("economy=" in h for h in headers)
    return row


def peer(python, name, sent, edited):
    """A peer compressor run on each request of the session in its own interpreter
    (bench/economy_peers.py); `None` when it cannot run."""
    script = os.path.join(ROOT, "bench", "economy_peers.py")
    run = subprocess.run([python, script, name], input=json.dumps(sent), capture_output=True, text=True)
    if run.returncode != 0:
        print(f"SKIP {name}: {run.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    out = json.loads(run.stdout)
    row = figures(out["messages"], sent, edited, out["seconds"])
    row["version"] = out["version"]
    return row


def figures(got, sent, edited, times):
    """The figures of what reached the upstream (`got`) for the session's requests."""
    assert len(got) == len(sent)
    serial = [json.dumps(m) for m in got]
    shares, reused, repeated, extends = [], [], 0, 0
    for prev, cur in zip(serial, serial[1:]):
        p = common_prefix(prev, cur)
        shares.append(p / len(cur))
        reused.append(p / len(prev))
        repeated += p
        extends += cur.startswith(prev[:-1])
    latest = sum(g[-1] == s[-1] for g, s in zip(got, sent))
    edit_call = sent[EDIT_TURN][-2]
    after_edit = got[EDIT_TURN + 1:]
    edit_seen = sum(edit_call in g and any(m.get("content") == edited for m in g) for g in after_edit)
    last = json.dumps(got[-1])
    facts = [f for f in FACTS if json.dumps(f)[1:-1] in last]
    total = sum(len(s) for s in serial)
    return {
        "tokens_sent": total // BYTES_PER_TOKEN,
        "last_request_tokens": len(serial[-1]) // BYTES_PER_TOKEN,
        "prefix_share": sum(shares) / len(shares),
        "tokens_repeated": repeated / total,
        "previous_reused": sum(reused) / len(reused),
        "extending": extends,
        "latest_verbatim": latest,
        "edit_visible": edit_seen,
        "after_edit": len(after_edit),
        "facts": len(facts),
        "facts_missing": [f for f in FACTS if f not in facts],
        "valid": sum(valid(g) for g in got),
        "requests": len(got),
        # What a provider that bills prompt-cache reads at a share of the price charges,
        # in tokens at full price: the repeated prefixes at that share, the rest whole.
        "cost_10": (total - 0.9 * repeated) / BYTES_PER_TOKEN,
        "cost_50": (total - 0.5 * repeated) / BYTES_PER_TOKEN,
        "median_ms": sorted(times)[len(times) // 2] * 1000,
        "shares": [round(s, 4) for s in shares],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(ROOT, "target/debug/compaction-proxy"))
    parser.add_argument("--age", type=int, default=None, help="economy_age (the proxy's default if unset)")
    parser.add_argument("--batch-tokens", type=int, default=None, help="economy_batch_tokens")
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--rounds", type=int, default=1,
                        help="the 30-turn script this many times (the later rounds after the fix)")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=PYTHON",
                        help="also run a peer (llmtrim, kompact, headroom) with this interpreter, "
                             "which has it installed (a venv of its own: see bench/README.md); repeatable")
    args = parser.parse_args()
    turns, edited = session(args.seed, args.rounds)
    sent = requests(turns)
    on = "economy = true\n"
    if args.age is not None:
        on += f"economy_age = {args.age}\n"
    if args.batch_tokens is not None:
        on += f"economy_batch_tokens = {args.batch_tokens}\n"
    rows = {}
    for name, compaction in [("off", ""), ("on", on)]:
        rows[name] = measure(args.binary, compaction, sent, edited)
        print(f"{name}: {rows[name]}", file=sys.stderr, flush=True)
    for spec in args.peer:
        name, python = spec.split("=", 1)
        row = peer(python, name, sent, edited)
        if row:
            rows[f"{name} {row.pop('version')}"] = row
            print(f"{name}: {row}", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    off, on_ = rows["off"], rows["on"]
    print(f"{len(turns)}-turn tool session, 200k window; economy settings: `{on.strip().replace(chr(10), '; ')}`; "
          f"seed {args.seed}\n")
    print("| proxy | tokens sent | last request | prefix share (mean) | tokens repeated (of sent) "
          "| previous reused (mean) | requests extending the previous | latest output verbatim "
          "| edit visible after it | facts kept | valid | cost, cache reads at 10% | at 50% | median turn |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows.items():
        label = {"off": "economy off", "on": "economy on"}.get(name, name)
        print(f"| {label} | {r['tokens_sent']:,} | {r['last_request_tokens']:,} | {r['prefix_share']:.1%} "
              f"| {r['tokens_repeated']:.1%} | {r['previous_reused']:.1%} | {r['extending']}/{r['requests'] - 1} "
              f"| {r['latest_verbatim']}/{r['requests']} | {r['edit_visible']}/{r['after_edit']} "
              f"| {r['facts']}/{len(FACTS)} | {r['valid']}/{r['requests']} | {r['cost_10']:,.0f} | {r['cost_50']:,.0f} "
              f"| {r['median_ms']:.1f} ms |")
    if len(rows) > 2:
        print("\nPeers: each compresses every request of the session on its own (no proxy, no mock); "
              "the median turn is its compression time alone.")
    print(f"\ntokens sent: {1 - on_['tokens_sent'] / off['tokens_sent']:.1%} fewer with economy on; "
          f"prefix share {100 * (on_['prefix_share'] - off['prefix_share']):+.1f} points, previous reused "
          f"{100 * (on_['previous_reused'] - off['previous_reused']):+.1f} points; cost with cache reads at 10% "
          f"{1 - on_['cost_10'] / off['cost_10']:.1%} lower, at 50% {1 - on_['cost_50'] / off['cost_50']:.1%} lower")


if __name__ == "__main__":
    main()
