#!/usr/bin/env python3
"""How much of what a continuing model needs survives the deterministic digest.

Generates N long agent transcripts per style (seeded, so every run writes the same bytes),
plants five facts in their middle, compacts each with the offline command

    compaction-proxy compact --context-window W

(no --summarize-via: the summary is the deterministic digest) and counts, per kind of
fact, how often it is still in the output when the message that held it was dropped.

The five facts:
  constraint  a user constraint ("Never modify config/prod_k3.yaml; ...") in a user message
  number      a six-digit number stated in a user message
  error       the line of a build or test output that says what failed, deep in the
              output (the last line of a Python traceback, rustc's error[E...], pytest's
              FAILED summary line, the informative npm ERR! line)
  path        a file path that appears only in a tool output or observation
  decision    a sentence of assistant text stating a decision

The styles:
  plain  a chat agent with no tools: the user pastes command output into messages
  swe    SWE-agent style: THOUGHT plus one ```bash block; observations come back as
         user messages
  tools  a coding agent with parallel tool calls (results arrive out of order) and twice
         the steps, since its outputs are pruned before anything is summarised

A fact's message counts as dropped when nothing outside the summary still holds it (for a
tool result: its tool_call_id; otherwise the first 80 characters of its text). Facts whose
message was kept are not counted: the digest had nothing to do with them.

    python3 bench/digest_facts.py --binary target/debug/compaction-proxy
    python3 bench/digest_facts.py --binary ../bin/cp-before --n 100 --window 16384

Python 3 standard library only.
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "fixtures", "transcripts"))
# The facts a user states, and the ids that make facts unique, are plant.py's: generated
# transcripts say them as planted real ones do.
from plant import constraint as fact_constraint, number as fact_number, uid  # noqa: E402

MARKER = "[compaction-proxy: summary of earlier turns]"
END_MARKER = "[end of summary; the conversation continues below]"
# The tight frame of a summary of a line or two ends with this one instead.
END_MARKER_SHORT = "[end of summary]"
KINDS = ["constraint", "number", "error", "path", "decision"]
STYLES = ["plain", "swe", "tools"]

PKGS = ["billing", "ledger", "ingest", "auth", "reports", "search", "notify", "export"]
MODS = ["invoice", "rounding", "adapter", "session", "handlers", "schema", "retry", "cache",
        "parser", "merge", "policy", "webhook", "tokens", "window"]
WORDS = ("the a value row rows item cursor batch buffer result status config client server "
         "request response record field total count offset limit page token key index "
         "table column parse load save merge split flush retry timeout handler").split()
FUNCS = ["parse_rows", "load_config", "apply_discount", "round_money", "flush_batch",
         "merge_records", "open_session", "refresh_token", "render_report", "split_pages"]


# --- the facts ---------------------------------------------------------------------------

def fact_decision(rng):
    a, b = rng.sample(MODS, 2)
    u = uid(rng)
    return rng.choice([
        f"I'll replace the hand-written {a} loop with {b}_{u}() instead of patching each call site, because the loop repeats the same bug in four places.",
        f"Decision: we keep the {a} cache and drop the {b}_{u} layer, since nothing reads from it any more.",
        f"The root cause is that {a}_{u} rounds before summing; the fix is to sum exact decimals and round once.",
        f"Let's go with a per-tenant {a} bucket named {b}_{u}, which keeps one noisy tenant from starving the rest.",
        f"I'm going to move the {a} checks into {b}_{u}.py so the CLI and the API share them.",
        f"We will store {a} timestamps as UTC in {b}_{u} from now on and convert only for display.",
    ])


def fact_path(rng):
    return f"src/{rng.choice(PKGS)}/{rng.choice(MODS)}_{uid(rng)}/{rng.choice(MODS)}.py"


def python_traceback(rng, u):
    frames = [("/repo/manage.py", rng.randint(10, 40), "<module>", "main()"),
              ("/repo/src/app/cli.py", rng.randint(20, 90), "main", "run(args)")]
    for _ in range(rng.randint(2, 5)):
        f = rng.choice(FUNCS)
        frames.append((f"/repo/src/app/{rng.choice(MODS)}.py", rng.randint(10, 400), f,
                       f"return {rng.choice(FUNCS)}({rng.choice(WORDS)})"))
    line = rng.choice([
        f"ValueError: invalid literal for int() with base 10: '{u}'",
        f"KeyError: 'tenant_{u}'",
        f"TypeError: unsupported operand type(s) for +: 'Decimal' and 'float' (column {u})",
        f"decimal.InvalidOperation: [<class 'decimal.ConversionSyntax'>] while parsing {u}",
    ])
    out = ["Traceback (most recent call last):"]
    for path, n, fn, code in frames:
        out.append(f'  File "{path}", line {n}, in {fn}')
        out.append(f"    {code}")
    out.append(line)
    return "\n".join(out), line


def rustc_output(rng, u):
    line = f"error[E0425]: cannot find value `retry_budget_{u}` in this scope"
    warn = [f"warning: unused import: `std::fmt`", f" --> src/{rng.choice(MODS)}.rs:3:5", "  |",
            "3 | use std::fmt;", "  |     ^^^^^^^^", "  |",
            "  = note: `#[warn(unused_imports)]` on by default", ""]
    out = ["   Compiling ledger v0.3.1 (/repo)"] + warn * rng.randint(1, 3) + [
        line, f"  --> src/client.rs:{rng.randint(100, 400)}:17", "   |",
        f"214 |         if n >= retry_budget_{u} {{", "   |                 ^^^^^^^^^^^^^^^ not found in this scope",
        "", "error: could not compile `ledger` (lib) due to 1 previous error; 1 warning emitted"]
    return "\n".join(out), line


def pytest_output(rng, u):
    line = (f"FAILED tests/test_ledger.py::test_round_half_even_{u} - AssertionError: "
            f"assert Decimal('10.05') == Decimal('10.04')")
    out = ["============================= test session starts ==============================",
           "platform linux -- Python 3.11.6, pytest-7.4.3, pluggy-1.3.0",
           "rootdir: /repo", f"collected {rng.randint(40, 90)} items", ""]
    for f in ["test_api", "test_cli", "test_ledger", "test_models", "test_views"]:
        dots = "".join(rng.choice("....F") if f == "test_ledger" else "." for _ in range(rng.randint(5, 15)))
        out.append(f"tests/{f}.py {dots}".ljust(70) + f"[{rng.randint(1, 99):>3}%]")
    out += ["", "=================================== FAILURES ===================================",
            f"_________________________ test_round_half_even_{u} _________________________", "",
            f"    def test_round_half_even_{u}():",
            ">       assert round_money(Decimal(\"10.045\")) == Decimal(\"10.04\")",
            "E       AssertionError: assert Decimal('10.05') == Decimal('10.04')",
            "E        +  where Decimal('10.05') = round_money(Decimal('10.045'))", "",
            "tests/test_ledger.py:41: AssertionError",
            "=========================== short test summary info ============================",
            line, f"========================= 1 failed, {rng.randint(40, 90)} passed in 3.21s ========================="]
    return "\n".join(out), line


def npm_output(rng, u):
    line = f'npm ERR! Missing script: "build:ssr-{u}"'
    out = ["npm WARN deprecated inflight@1.0.6: This module is not supported, and leaks memory.",
           "npm WARN deprecated glob@7.2.3: Glob versions prior to v9 are no longer supported",
           "npm ERR! code ELIFECYCLE" if rng.random() < 0.5 else "npm ERR! code 1",
           line, "npm ERR!", "npm ERR! To see a list of scripts, run:", "npm ERR!   npm run", "",
           "npm ERR! A complete log of this run can be found in:",
           f"npm ERR!     /root/.npm/_logs/2025-05-0{rng.randint(1, 9)}T10_2{rng.randint(0, 9)}_00_000Z-debug-0.log"]
    return "\n".join(out), line


ERROR_KINDS = {
    "plain": [python_traceback, npm_output],
    "swe": [python_traceback, pytest_output],
    "tools": [rustc_output, pytest_output, npm_output, python_traceback],
}


# --- filler ------------------------------------------------------------------------------

def code(rng, lines):
    out = []
    for _ in range(lines):
        indent = "    " * rng.randint(0, 3)
        out.append(indent + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))))
    return "\n".join(out)


def passing_tests(rng):
    n = rng.randint(20, 60)
    lines = [f"tests/test_{rng.choice(MODS)}.py::test_{rng.choice(FUNCS)}_{i} PASSED" for i in range(n)]
    return "\n".join(lines + [f"==== {n} passed in {rng.randint(1, 30)}.{rng.randint(0, 99)}s ===="])


def grep_output(rng, pattern, extra=None):
    hits = [f"src/{rng.choice(PKGS)}/{rng.choice(MODS)}.py:{rng.randint(1, 900)}:    {pattern}({rng.choice(WORDS)})"
            for _ in range(rng.randint(3, 12))]
    if extra:
        hits.insert(rng.randint(0, len(hits)), f"{extra}:{rng.randint(1, 900)}:    {pattern}({rng.choice(WORDS)})")
    return "\n".join(hits)


def error_pool(rng):
    """Failures that are not the planted one: errors compete for the digest's room too.
    A session keeps meeting the same few until they are fixed, so each transcript draws
    its failures from a small pool."""
    return [rng.choice(ERROR_KINDS["tools"])(rng, uid(rng))[0] for _ in range(4)]


def filler_output(rng, errors):
    k = rng.random()
    if errors and k < 0.1:
        return rng.choice(errors)
    if k < 0.45:
        return code(rng, rng.randint(40, 140))
    if k < 0.75:
        return passing_tests(rng)
    return grep_output(rng, rng.choice(FUNCS))


def prose(rng, sentences):
    out = []
    for _ in range(sentences):
        out.append(rng.choice([
            f"The {rng.choice(WORDS)} handling in {rng.choice(FUNCS)} looks fine.",
            f"Next I need to look at how {rng.choice(FUNCS)} reads the {rng.choice(WORDS)}.",
            f"That output shows the {rng.choice(WORDS)} is passed through unchanged.",
            f"Let me check {rng.choice(FUNCS)} as well.",
            f"This part only formats the {rng.choice(WORDS)} for the report.",
            f"The tests around {rng.choice(FUNCS)} still pass.",
            # Steps and reasons of no lasting interest, phrased like decisions.
            f"I'll read {rng.choice(FUNCS)} next.",
            f"Let's run the tests again after this change.",
            f"This returns early because the {rng.choice(WORDS)} is empty.",
            f"I will add a docstring to {rng.choice(FUNCS)} while I am here.",
        ]))
    return " ".join(out)


# --- styles ------------------------------------------------------------------------------
# Each builder returns (messages, facts): facts maps a kind to (message index, fact text).

def build_plain(rng, steps):
    msgs = [{"role": "system", "content": "You are a senior Python engineer helping a developer "
             "port an internal billing service. Answer with explanations and code. " * 3},
            {"role": "user", "content": "We are moving the billing service from Flask to FastAPI. "
             "Walk me through it step by step; I will run things locally and paste the output."},
            {"role": "assistant", "content": "Sure. Start by listing the Flask blueprints so we can map them."}]
    facts = {}
    plant = dict(zip(KINDS, rng.sample(range(steps * 2 // 5, steps * 3 // 5), 5)))
    err_text, err_line = rng.choice(ERROR_KINDS["plain"])(rng, uid(rng))
    errors = error_pool(rng)
    for step in range(steps):
        kind = next((k for k, s in plant.items() if s == step), None)
        if kind == "constraint":
            c = fact_constraint(rng)
            user = f"Quick note before you continue. {c} Now, what about the {rng.choice(FUNCS)} view?"
            facts[kind] = (len(msgs), c)
        elif kind == "number":
            n, text = fact_number(rng)
            user = f"{text} Can you look at {rng.choice(FUNCS)} next?"
            facts[kind] = (len(msgs), n)
        elif kind == "error":
            user = f"Running the import now gives me this:\n```\n{err_text}\n```\nWhat is wrong?"
            facts[kind] = (len(msgs), err_line)
        elif kind == "path":
            p = fact_path(rng)
            user = f"Here is what grep finds:\n```\n{grep_output(rng, rng.choice(FUNCS), p)}\n```"
            facts[kind] = (len(msgs), p)
        else:
            user = rng.choice([
                f"Done. Next, {rng.choice(FUNCS)}?",
                f"I ran it:\n```\n{filler_output(rng, errors)}\n```",
                f"Here is the current {rng.choice(FUNCS)}:\n```python\n{code(rng, rng.randint(20, 60))}\n```",
            ])
        msgs.append({"role": "user", "content": user})
        text = prose(rng, rng.randint(2, 5)) + f"\n\n```python\n{code(rng, rng.randint(15, 50))}\n```\n" + prose(rng, 2)
        if kind == "decision":
            d = fact_decision(rng)
            text = prose(rng, 2) + " " + d + "\n\n" + text
            facts[kind] = (len(msgs), d)
        msgs.append({"role": "assistant", "content": text})
    msgs.append({"role": "user", "content": "OK, what should I do next?"})
    return msgs, facts


def build_swe(rng, steps):
    mini = rng.random() < 0.5

    def obs(out, rc=0):
        if mini:
            return f"<returncode>{rc}</returncode>\n<output>\n{out}\n</output>"
        return f"OBSERVATION:\n{out}"

    msgs = [{"role": "system", "content": "You are a helpful assistant that can interact with a computer shell "
             "to solve programming tasks. Your response must contain exactly ONE bash code block with ONE "
             "command, preceded by a THOUGHT section explaining your reasoning. " * 3},
            {"role": "user", "content": "<pr_description>\nImporting a CSV with a quantity column of '1e3' "
             "crashes the ledger importer. Make the importer accept scientific notation.\n</pr_description>"},
            {"role": "assistant", "content": "THOUGHT: Let me look at the repository layout first.\n\n```bash\nls -R src | head -50\n```"}]
    facts = {}
    plant = dict(zip(KINDS, rng.sample(range(steps * 2 // 5, steps * 3 // 5), 5)))
    err_text, err_line = rng.choice(ERROR_KINDS["swe"])(rng, uid(rng))
    errors = error_pool(rng)
    msgs.append({"role": "user", "content": obs(filler_output(rng, errors))})
    for step in range(steps):
        kind = next((k for k, s in plant.items() if s == step), None)
        thought = prose(rng, rng.randint(1, 3))
        cmd = rng.choice([f"cat src/app/{rng.choice(MODS)}.py", f"grep -rn '{rng.choice(FUNCS)}' src",
                          "python -m pytest -q tests", f"sed -n '1,80p' src/app/{rng.choice(MODS)}.py"])
        if kind == "decision":
            d = fact_decision(rng)
            thought = f"{thought} {d}"
            facts[kind] = (len(msgs), d)
        msgs.append({"role": "assistant", "content": f"THOUGHT: {thought}\n\n```bash\n{cmd}\n```"})
        if kind == "constraint":
            c = fact_constraint(rng)
            facts[kind] = (len(msgs), c)
            reply = f"Command not executed. The user rejected your command with the following message: {c}"
        elif kind == "number":
            n, text = fact_number(rng)
            facts[kind] = (len(msgs), n)
            reply = f"Command not executed. The user rejected your command with the following message: {text}"
        elif kind == "error":
            facts[kind] = (len(msgs), err_line)
            reply = obs(err_text, 1)
        elif kind == "path":
            p = fact_path(rng)
            facts[kind] = (len(msgs), p)
            reply = obs(grep_output(rng, rng.choice(FUNCS), p))
        else:
            reply = obs(filler_output(rng, errors))
        msgs.append({"role": "user", "content": reply})
    return msgs, facts


def build_tools(rng, steps):
    # Tool outputs are pruned to one line before anything is summarised: twice the steps
    # make the middle large enough to need a summary at the same window.
    steps *= 2
    msgs = [{"role": "system", "content": "You are a coding agent in a repository at /repo. Use the tools to "
             "read and edit files and to run commands. Run the tests after each change. " * 3},
            {"role": "user", "content": "The nightly ledger export is failing. Find out why and fix it."}]
    facts = {}
    plant = dict(zip(KINDS, rng.sample(range(steps * 2 // 5, steps * 3 // 5), 5)))
    err_text, err_line = rng.choice(ERROR_KINDS["tools"])(rng, uid(rng))
    errors = error_pool(rng)
    call_n = 0
    for step in range(steps):
        kind = next((k for k, s in plant.items() if s == step), None)
        if kind in ("constraint", "number"):
            if kind == "constraint":
                c = fact_constraint(rng)
                facts[kind] = (len(msgs), c)
                msgs.append({"role": "user", "content": f"Also: {c}"})
            else:
                n, text = fact_number(rng)
                facts[kind] = (len(msgs), n)
                msgs.append({"role": "user", "content": text})
        elif rng.random() < 0.12:
            msgs.append({"role": "user", "content": rng.choice([
                "Continue.", "Looks good so far, carry on.",
                f"Also check that {rng.choice(FUNCS)} still handles an empty {rng.choice(WORDS)}.",
                f"While you are there, is {rng.choice(FUNCS)} still used anywhere?",
                f"Please add a test for {rng.choice(FUNCS)} when you are done."])})
        calls, results = [], []
        for j in range(rng.randint(2, 4)):
            call_n += 1
            cid = f"call_{call_n:04d}"
            tool = rng.choice(["read_file", "bash", "grep"])
            if tool == "read_file":
                args = {"path": f"src/{rng.choice(PKGS)}/{rng.choice(MODS)}.py"}
            elif tool == "bash":
                args = {"command": rng.choice(["python -m pytest -q", "cargo build", "npm run build", "git status"])}
            else:
                args = {"pattern": rng.choice(FUNCS), "path": "src"}
            out = filler_output(rng, errors if tool == "bash" else None)
            if kind == "error" and j == 0:
                tool, args, out = "bash", {"command": "make check"}, err_text
                facts[kind] = (cid, err_line)
            elif kind == "path" and j == 0:
                tool, args = "grep", {"pattern": rng.choice(FUNCS), "path": "."}
                p = fact_path(rng)
                out = grep_output(rng, args["pattern"], p)
                facts[kind] = (cid, p)
            calls.append({"id": cid, "type": "function",
                          "function": {"name": tool, "arguments": json.dumps(args)}})
            results.append({"role": "tool", "tool_call_id": cid, "content": out})
        content = None
        if kind == "decision":
            d = fact_decision(rng)
            content = f"{prose(rng, 1)} {d}"
            facts[kind] = (len(msgs), d)
        elif rng.random() < 0.3:
            content = prose(rng, rng.randint(1, 2))
        msgs.append({"role": "assistant", "content": content, "tool_calls": calls})
        rng.shuffle(results)
        msgs.extend(results)
    msgs.append({"role": "assistant", "content": "The export runs again; all tests pass."})
    msgs.append({"role": "user", "content": "Thanks. Summarise what you changed."})
    return msgs, facts


BUILDERS = {"plain": build_plain, "swe": build_swe, "tools": build_tools}


# --- measuring ---------------------------------------------------------------------------

def text_of(m):
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(p.get("text", "") for p in c if isinstance(p, dict))
    return ""


def find_end(text, start):
    """(offset, length) of the first end marker of either form from `start`, or (-1, 0)."""
    found = [(at, len(m)) for m in (END_MARKER, END_MARKER_SHORT)
             if (at := text.find(m, start)) >= 0]
    return min(found) if found else (-1, 0)


def outside_summary(text):
    start = text.find(MARKER)
    if start < 0:
        return text
    end, length = find_end(text, start)
    return text[:start] + ("" if end < 0 else text[end + length:])


def measure(binary, style, i, steps, window):
    rng = random.Random(f"{style}-{i}")
    msgs, facts = BUILDERS[style](rng, steps)
    body = {"model": "gpt-4o", "messages": msgs}
    run = subprocess.run([binary, "compact", "--context-window", str(window)],
                         input=json.dumps(body).encode(), capture_output=True, check=False)
    if run.returncode not in (0, 3):
        sys.exit(f"{style} #{i}: exit {run.returncode}: {run.stderr.decode()}")
    out = json.loads(run.stdout)["messages"]
    kept_ids = {m.get("tool_call_id") for m in out}
    outside = [outside_summary(text_of(m)) for m in out]
    everything = "\n".join(text_of(m) for m in out)
    holder = next((text_of(m) for m in out if MARKER in text_of(m)), "")
    summary = holder[holder.find(MARKER):find_end(holder, 0)[0]] if holder else ""
    result = {}
    for kind, (where, fact) in facts.items():
        if isinstance(where, str):
            dropped = where not in kept_ids
        else:
            probe = text_of(msgs[where])[:80]
            dropped = not any(probe in t for t in outside)
        if dropped:
            result[kind] = fact in everything
    return result, len(summary)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default="target/debug/compaction-proxy")
    ap.add_argument("--n", type=int, default=100, help="transcripts per style")
    ap.add_argument("--steps", type=int, default=60, help="agent steps per transcript")
    ap.add_argument("--window", type=int, default=16384)
    ap.add_argument("--styles", default=",".join(STYLES))
    ap.add_argument("--dump", help="write style-0 transcripts of each style here (a directory)")
    args = ap.parse_args()
    styles = args.styles.split(",")
    if args.dump:
        for style in styles:
            msgs, _ = BUILDERS[style](random.Random(f"{style}-0"), args.steps)
            with open(f"{args.dump}/{style}.json", "w") as f:
                json.dump({"model": "gpt-4o", "messages": msgs}, f, indent=1)
    totals = {s: {k: [0, 0] for k in KINDS} for s in styles}
    sizes = {s: [] for s in styles}
    for style in styles:
        for i in range(args.n):
            result, size = measure(args.binary, style, i, args.steps, args.window)
            sizes[style].append(size)
            for kind, kept in result.items():
                totals[style][kind][0] += int(kept)
                totals[style][kind][1] += 1
    print(f"binary {args.binary}, window {args.window}, {args.n} transcripts per style, "
          f"{args.steps} steps each")
    print()
    print("| style | " + " | ".join(KINDS) + " | summary chars (median) |")
    print("|---|" + "---|" * len(KINDS) + "---|")
    grand = {k: [0, 0] for k in KINDS}
    for style in styles:
        cells = []
        for k in KINDS:
            kept, dropped = totals[style][k]
            grand[k][0] += kept
            grand[k][1] += dropped
            cells.append(f"{kept}/{dropped}")
        med = sorted(sizes[style])[len(sizes[style]) // 2]
        print(f"| {style} | " + " | ".join(cells) + f" | {med} |")
    print("| all | " + " | ".join(f"{grand[k][0]}/{grand[k][1]}" for k in KINDS) + " | |")


if __name__ == "__main__":
    main()
