#!/usr/bin/env python3
"""Compaction events and what they cost a session (issues 14 and 27), before and after.

Drives scripted sessions through two proxy binaries in one run ("before" and "after"),
against a mock upstream in this process that

- counts tokens as bytes/3 of the JSON of the messages (bytes/4 for the chat session, as
  in bench/results/events-2026-11-23.md), and enforces its window: a request whose count
  plus its max_tokens exceeds the window gets a 400 `context_length_exceeded` in OpenAI's
  wording, which names the window (`--refusal bare`: a wording that does not);
- answers the proxy's summariser (told apart by its prompt) after 3 s (`--summary-delay`).

Sessions (turn sizes and think times from a seeded RNG, the same for both binaries):

- tight: 40 turns of a bursty tool session (parallel tool calls, files written and read
  again, long command outputs), each turn adding 10-20% of a 30k window; 1-2 s between turns;
- roomy: the same turns at a 90k window;
- chat: the 100-turn chat session of events-2026-11-23.md (32k window, 1 s between turns).

Each twice: window configured (`[[models]] match = "*"`) and window learned (no
`[[models]]`: the proxy learns it from the first refusal). Per run it reports, over the
requests the upstream accepted for the conversation (summariser calls aside):

- events: accepted requests whose messages do not byte-extend the previous accepted
  request's;
- summariser calls, the target length each asked for, and refusals (400s for the window);
- requests extending the previous (the figure of events-2026-11-23.md);
- bytes repeated: for each accepted request after the first, the longest common prefix of
  its serialized messages with the previous accepted request's, over its size; the mean;
- tokens repeated: those prefixes in tokens, over all tokens of the accepted requests
  (the share of the session's input a prompt cache could read);
- slowest turn: the slowest turn's answer time minus the median turn's (and which turn);
- tokens sent upstream: the sum over accepted requests.

Only the standard library. Usage:

    python3 bench/events.py [--before PATH] [--after PATH] [--quick] [--sessions tight,roomy,chat]
        [--modes configured,learned] [--summary-delay S] [--seed N] [--refusal openai|bare]
        [--json FILE]

--before BIN (required): the binary to compare against; --after defaults to
target/release/compaction-proxy.
`--quick` is a smoke run (fewer turns, times scaled by 0.1) of a minute or two on debug
builds. Progress goes to stderr, the markdown table to stdout.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY_PROMPT = "You are writing a checkpoint"
TARGET = re.compile(r"Target length: about (\d+) tokens")
# A checkpoint the proxy accepts (every heading, something under each; ~1.7 KB, ~550 tokens
# at bytes/3), the same for every call: what it says does not matter here, its size does.
SUMMARY_TEXT = """## Active Task
Make the failing module tests pass again after the refactor of the step functions.

## Goal
Keep every module's step function total and overflow-free, with the test suite green.

## Constraints and Preferences
- Do not change the public signatures of the step functions.
- Keep state.total a u64; never let it wrap.

## Completed Actions
- Read the failing modules, ran their tests, rewrote the overflow checks in several of them.
- Replaced the casts that lost precision with checked conversions.

## Active State
The last test run still reports mismatched types (usize against u64) in two modules.

## In Progress
Converting the remaining compute calls to return u64 and checking the limits before adding.

## Blockers
None.

## Key Decisions
- Overflow is reported as Error::Overflow with the position and the value, not clamped.

## Resolved Questions
- The limit is checked before the multiplication, not after.

## Pending Asks
None.

## Relevant Files
- src/module_0.rs to src/module_7.rs: the step functions and their state updates.

## Remaining Work
- Fix the remaining type mismatches, run cargo test for every module, then the full suite.

## Critical Values
- The multiplier range is 2 to 96; state.limit is per module.
"""
# The tool sessions' turns are sized against this window whatever the session's window
# is, so that "roomy" is the very session of "tight" with more room.
TOOL_BASE_WINDOW = 30_000
# A turn answered this much later than the median turn waited for something (issue 27's
# bound for the tight session's slowest turn).
WAIT_MS = 300


# --- the mock upstream ---------------------------------------------------------------------


def serialize(messages):
    """The bytes the mock counts and compares: the messages as JSON, ASCII, one spelling."""
    return json.dumps(messages)


def text_of(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def is_summary_call(messages):
    return any(text_of(m.get("content")).lstrip().startswith(SUMMARY_PROMPT) for m in messages[:2])


class Mock:
    """One upstream per run: its window, its counting, its wording, and what it saw."""

    def __init__(self, window, bytes_per_token, summary_delay, refusal):
        self.window = window
        self.bytes_per_token = bytes_per_token
        self.summary_delay = summary_delay
        self.refusal = refusal
        self.accepted = []  # (serialized messages, tokens), in the order answered
        self.refusals = 0
        self.summaries = 0
        self.targets = []  # each summariser call's "Target length: about N tokens"
        self.lock = threading.Lock()
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                status, value = mock.handle(body)
                data = json.dumps(value).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    # A summariser call the proxy cancelled (its preparation was left
                    # behind by an event): nobody reads the answer. It is still counted.
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def tokens(self, serialized):
        return len(serialized) // self.bytes_per_token

    def handle(self, body):
        messages = body.get("messages", [])
        serialized = serialize(messages)
        count = self.tokens(serialized)
        if is_summary_call(messages):
            target = TARGET.search(serialized)
            with self.lock:
                self.summaries += 1
                self.targets.append(int(target.group(1)) if target else None)
            time.sleep(self.summary_delay)
            return 200, self.answer(SUMMARY_TEXT, count)
        completion = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        if count + completion > self.window:
            with self.lock:
                self.refusals += 1
            return 400, self.refusal_body(count, completion)
        with self.lock:
            self.accepted.append((serialized, count))
        return 200, self.answer(f"Done with turn; saw {len(messages)} messages.", count)

    def refusal_body(self, count, completion):
        if self.refusal == "bare":
            message = "Your input exceeds the context window of this model. Please adjust your input and try again."
        elif completion:
            message = (f"This model's maximum context length is {self.window} tokens. However, you requested "
                       f"{count + completion} tokens ({count} in the messages, {completion} in the completion). "
                       "Please reduce the length of the messages or completion.")
        else:
            message = (f"This model's maximum context length is {self.window} tokens. However, your messages "
                       f"resulted in {count} tokens. Please reduce the length of the messages.")
        return {"error": {"message": message, "type": "invalid_request_error", "param": "messages",
                          "code": "context_length_exceeded"}}

    @staticmethod
    def answer(text, prompt_tokens):
        return {"id": "chatcmpl-bench", "object": "chat.completion", "model": "bench-model", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 10,
                      "total_tokens": prompt_tokens + 10}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# --- the proxy -----------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_proxy(binary, upstream_port, window, workdir):
    """The proxy with its defaults, a memory cache (nothing learned or summarised survives
    the run) and, when `window` is set, that window for every model."""
    port = free_port()
    config = os.path.join(workdir, "proxy.toml")
    models = f'[[models]]\nmatch = "*"\ncontext_window = {window}\n' if window else ""
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\n[upstream]\nbase_url = "http://127.0.0.1:{upstream_port}/v1"\n'
                f'[cache]\nbackend = "memory"\n{models}')
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(workdir, "state"), HOME=workdir)
    log = open(os.path.join(workdir, "proxy.log"), "w")
    proc = subprocess.Popen([binary, "--config", config], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(300):
            if proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                return proc, port
            except OSError:
                time.sleep(0.1)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    proc.kill()
    proc.wait()
    with open(os.path.join(workdir, "proxy.log")) as f:
        sys.stderr.write(f.read()[-2000:])
    raise SystemExit(f"the proxy {binary} did not start")


def post(port, messages):
    body = json.dumps({"model": "bench-model", "messages": messages}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json", "authorization": "Bearer k"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"the proxy answered {e.code}: {e.read()[:500]!r}")
    took = time.monotonic() - started
    return answer["choices"][0]["message"]["content"], took


# --- the sessions ----------------------------------------------------------------------------


def json_len(text):
    return len(json.dumps(text)) - 2


def fill(lines, budget):
    """Lines from the generator until their JSON-escaped size reaches `budget` bytes."""
    out, size = [], 0
    for line in lines:
        if size >= budget:
            break
        out.append(line)
        size += json_len(line) + 2
    return "\n".join(out) + "\n"


def source_lines(rng, path, version):
    name = os.path.splitext(os.path.basename(path))[0]
    i = 0
    while True:
        kind = rng.randrange(6)
        if kind == 0:
            yield f"pub fn {name}_step_{i}(input: &[u8], state: &mut State) -> Result<usize, Error> {{"
        elif kind == 1:
            yield f"    let value_{i} = compute_{version}(input, {rng.randrange(1000)}); // {path}:{i}"
        elif kind == 2:
            yield f"    if value_{i} > state.limit {{ return Err(Error::Overflow {{ at: {i}, got: value_{i} }}); }}"
        elif kind == 3:
            yield f"    state.total += value_{i} as u64 * {rng.randrange(2, 97)};"
        elif kind == 4:
            yield "    Ok(state.total as usize)\n}"
        else:
            yield f"// {name} v{version}: keeps the invariant that state.total never wraps ({i})"
        i += 1


def log_lines(rng, n):
    i = 0
    while True:
        kind = rng.randrange(5)
        if kind == 0:
            yield f"   Compiling dep_{rng.randrange(300)} v0.{rng.randrange(30)}.{rng.randrange(10)}"
        elif kind == 1:
            yield f"test module_{n}::case_{i} ... {'ok' if rng.random() < 0.9 else 'FAILED'}"
        elif kind == 2:
            yield (f"error[E0{rng.randrange(300, 700)}]: mismatched types in src/module_{n}.rs:{rng.randrange(1, 900)}:"
                   f"{rng.randrange(1, 80)} expected `usize`, found `u64`")
        elif kind == 3:
            yield f"    at app::module_{n}::step_{i} (src/module_{n}.rs:{rng.randrange(1, 900)})"
        else:
            yield f"warning: unused variable `value_{i}` in module_{n} (turn {n}, line {rng.randrange(1, 900)})"
        i += 1


def grep_lines(rng, n):
    i = 0
    while True:
        yield (f"src/module_{rng.randrange(12)}.rs:{rng.randrange(1, 900)}:    let value_{i} = "
               f"compute_{n}(input, {rng.randrange(1000)});")
        i += 1


FILES = [f"src/module_{i}.rs" for i in range(8)]


def tool_turn(rng, n):
    """One bursty turn: 2-4 parallel tool calls (read a file, write a file, run a command,
    grep), their outputs, adding 10-20% of a 30k-token window at bytes/3."""
    target = int(rng.uniform(0.10, 0.20) * TOOL_BASE_WINDOW * 3)
    kinds = ["read", "write", "run", "grep"]
    calls = [rng.choice(kinds[:3])] + rng.sample(kinds, rng.randint(1, 3))
    weights = [rng.uniform(0.5, 1.5) * (0.4 if k == "grep" else 1.0) for k in calls]
    user = {"role": "user", "content": f"Turn {n}: test_module_{n} fails after the last change; find out why and fix it."}
    paths = [rng.choice(FILES) for _ in calls]
    content_seed = rng.random()
    share = [w / sum(weights) for w in weights]
    budget = target
    for _ in range(3):
        # Built, measured, and built again with the budget corrected for the JSON around it.
        turn = build_tool_turn(random.Random(content_seed), n, user, calls, paths, [int(budget * s) for s in share])
        size = len(serialize(turn)) + 2
        budget = max(budget * target / size, 1000)
    return turn


def build_tool_turn(rng, n, user, calls, paths, budgets):
    tool_calls, outputs = [], []
    for j, (kind, path, budget) in enumerate(zip(calls, paths, budgets)):
        call_id = f"call_{n}_{j}"
        if kind == "read":
            args = {"path": path}
            output = fill(source_lines(rng, path, n), budget)
        elif kind == "write":
            # A written file's content is in the call's arguments, escaped twice over.
            args = {"path": path, "content": fill(source_lines(rng, path, n), budget * 2 // 3)}
            output = f"Wrote {len(args['content'])} bytes to {path}."
        elif kind == "run":
            args = {"cmd": f"cargo test module_{n} -- --nocapture"}
            output = fill(log_lines(rng, n), budget)
        else:
            args = {"pattern": f"compute_{n}", "path": "src/"}
            output = fill(grep_lines(rng, n), budget)
        name = {"read": "read_file", "write": "write_file", "run": "run", "grep": "grep"}[kind]
        tool_calls.append({"id": call_id, "type": "function",
                           "function": {"name": name, "arguments": json.dumps(args)}})
        outputs.append({"role": "tool", "tool_call_id": call_id, "content": output})
    return [user, {"role": "assistant", "content": None, "tool_calls": tool_calls}] + outputs


def chat_turn(rng, n):
    draft = f"Paragraph {n} of my draft, for you to review: " + "the argument turns on how the evidence is read, and why. " * 40
    return [{"role": "user", "content": draft}]


class Session:
    def __init__(self, name, label, turns, window, bytes_per_token, make, think, script):
        self.name, self.label, self.turns, self.window = name, label, turns, window
        self.bytes_per_token, self.make, self.think = bytes_per_token, make, think
        # Sessions of one script draw the same turns and think times.
        self.script = script


def sessions(quick, scale):
    tool_think = lambda rng: rng.uniform(1.0, 2.0) * scale
    chat_think = lambda rng: 1.0 * scale
    return {
        "tight": Session("tight", f"tight: {12 if quick else 40}-turn tool session, 30k window",
                         12 if quick else 40, 30_000, 3, tool_turn, tool_think, "tool"),
        "roomy": Session("roomy", f"roomy: {24 if quick else 40}-turn tool session, 90k window",
                         24 if quick else 40, 90_000, 3, tool_turn, tool_think, "tool"),
        "chat": Session("chat", f"chat: {56 if quick else 100}-turn chat session, 32k window",
                        56 if quick else 100, 32_000, 4, chat_turn, chat_think, "chat"),
    }


def drive(port, session, seed):
    rng = random.Random(f"{seed}/{session.script}")
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools to read, run and write."}]
    times = []
    for n in range(session.turns):
        messages.extend(session.make(rng, n))
        text, took = post(port, messages)
        times.append(took)
        messages.append({"role": "assistant", "content": text})
        time.sleep(session.think(rng))
    return times


# --- the figures ---------------------------------------------------------------------------


def common_prefix(a, b):
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def measure(binary, session, configured, args):
    mock = Mock(session.window, session.bytes_per_token, args.summary_delay, args.refusal)
    workdir = tempfile.mkdtemp(prefix="events-bench-")
    proxy, port = start_proxy(binary, mock.port, session.window if configured else None, workdir)
    try:
        times = drive(port, session, args.seed)
        # A preparation still running is counted with the session it belongs to.
        time.sleep(max(0.5, args.summary_delay + 0.5))
    finally:
        proxy.terminate()
        try:
            proxy.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()
        mock.close()
        if args.keep_logs:
            print(f"  proxy log: {workdir}/proxy.log", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    log = mock.accepted
    extends, shares, repeated_tokens = [], [], 0
    for (prev, _), (cur, _) in zip(log, log[1:]):
        extends.append(cur.startswith(prev[:-1]))
        prefix = common_prefix(prev, cur)
        shares.append(prefix / len(cur))
        repeated_tokens += prefix // session.bytes_per_token
    sent = sum(count for _, count in log)
    median = statistics.median(times)
    slowest = max(range(len(times)), key=lambda i: times[i])
    return {
        "turns": session.turns,
        "accepted": len(log),
        "events": extends.count(False),
        "summaries": mock.summaries,
        "summary_targets": mock.targets,
        "refusals": mock.refusals,
        "extend": sum(extends) / max(len(extends), 1),
        "bytes_repeated": statistics.mean(shares) if shares else 0.0,
        "tokens_repeated": repeated_tokens / sent if sent else 0.0,
        "median_ms": median * 1000,
        "slowest_added_ms": (times[slowest] - median) * 1000,
        "slowest_turn": slowest + 1,
        "tokens_sent": sent,
        "times_ms": [round(t * 1000, 1) for t in times],
        # Per accepted request after the first: where each event's share is lost.
        "shares": [round(share, 4) for share in shares],
        "sizes": [count for _, count in log],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, metavar="BIN",
                        help="the binary to compare against (a build of an earlier commit)")
    parser.add_argument("--after", default=os.path.join(ROOT, "target/release/compaction-proxy"))
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer turns, times x0.1")
    parser.add_argument("--sessions", default="tight,roomy,chat")
    parser.add_argument("--modes", default="configured,learned")
    parser.add_argument("--summary-delay", type=float, default=None, help="seconds (3; 0.3 with --quick)")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--refusal", choices=["openai", "bare"], default="openai",
                        help="openai: names the window (default); bare: does not")
    parser.add_argument("--json", help="write every figure, and each turn's answer time, to this file")
    parser.add_argument("--keep-logs", action="store_true", help="keep each run's proxy log")
    parser.add_argument("--table-from", metavar="FILE", help="print the table of an earlier run's --json file, run nothing")
    args = parser.parse_args()
    if args.table_from:
        with open(args.table_from) as f:
            earlier = json.load(f)
        return print_table(earlier["args"], earlier["rows"])
    # Killed, the script still stops the proxy it started (the `finally` in measure).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scale = 0.1 if args.quick else 1.0
    if args.summary_delay is None:
        args.summary_delay = 3.0 * scale
    binaries = [("before", args.before), ("after", args.after)]
    for name, path in binaries:
        if not os.access(path, os.X_OK):
            raise SystemExit(f"--{name} {path}: not an executable file")
    catalogue = sessions(args.quick, scale)
    chosen = [catalogue[s] for s in args.sessions.split(",")]
    modes = args.modes.split(",")
    rows = []
    for session in chosen:
        for mode in modes:
            for name, path in binaries:
                started = time.monotonic()
                row = measure(path, session, mode == "configured", args)
                row.update(session=session.label, mode=mode, proxy=name, binary=path)
                rows.append(row)
                brief = {k: v for k, v in row.items() if k not in ("times_ms", "session", "binary")}
                print(f"{session.name} / {mode} / {name} ({time.monotonic() - started:.0f} s): {brief}",
                      file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    print_table(vars(args), rows)


def waiting_turns(times_ms):
    """Turns answered more than WAIT_MS after the median turn: the ones that waited."""
    median = statistics.median(times_ms)
    return [i + 1 for i, t in enumerate(times_ms) if t - median > WAIT_MS]


def print_table(args, rows):
    print(f"before: `{args['before']}`; after: `{args['after']}`; summariser {args['summary_delay']:g} s; "
          f"seed {args['seed']}; refusal wording: {args['refusal']}\n")
    print("| session | window | proxy | events | summariser calls | refusals | requests extending the previous "
          "| summary targets (tokens) | bytes repeated (mean) | tokens repeated (of sent) | slowest turn over median "
          f"| turns over +{WAIT_MS} ms | median turn | tokens sent upstream |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: |")
    for r in rows:
        waited = ", ".join(map(str, waiting_turns(r["times_ms"]))) or "none"
        print(f"| {r['session']} | {r['mode']} | {r['proxy']} | {r['events']} | {r['summaries']} | {r['refusals']} "
              f"| {r['extend']:.0%} | {', '.join(str(t) for t in r.get('summary_targets', [])) or 'none'} "
              f"| {r['bytes_repeated']:.1%} | {r['tokens_repeated']:.1%} "
              f"| +{r['slowest_added_ms']:.0f} ms (turn {r['slowest_turn']}) | {waited} | {r['median_ms']:.0f} ms "
              f"| {r['tokens_sent']:,} |")

if __name__ == "__main__":
    main()
