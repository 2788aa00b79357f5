#!/usr/bin/env python3
"""What of the facts a continuing model needs survives compaction, on real agent
transcripts (fixtures/transcripts/real) and on generated ones (bench/digest_facts.py),
for compaction-proxy's deterministic digest, for Hermes Agent's compressor (no model, its
static fallback) on the same transcripts, and in what the proxy's LLM summariser is shown.

    python3 bench/fidelity.py --binary target/debug/compaction-proxy \
        [--hermes-python ~/.cache/compaction-proxy-bench/hermes-0.19.0/bin/python] \
        [--corpora real,generated,real2,real3,real4,real5,real6,real7,real8] [--generated-n 10] [--details out.jsonl] [--out table.md]

Facts are planted by fixtures/transcripts/plant.py (seeded: every run plants the same
bytes): a constraint and a number in a user interjection, an exact error line appended to
a tool output, a report path in a later tool output, a decision in an assistant turn, and
two secrets (an sk-proj- key in a user message, a ghp_ token in a tool output) early on.
The generated corpus keeps digest_facts.py's own five facts (its transcripts are built
around them) and gets the two secrets from plant.py.

The real2 corpus (fixtures/transcripts/real2: tau-bench, InterCode, Reflexion's ReAct runs)
is planted by fixtures/transcripts/plant2.py instead, in other wordings (several phrasings
per kind, each labelled; limits in several units; library exceptions with module paths,
compiler and HTTP errors; the interjection among a text agent's observations). For it the
summariser is also shown the transcript at the 75% and 1,024 windows, and further tables
follow the usual ones: by window, by source and by phrasing (ours, what the summariser
was shown, Hermes), by the role of the message that held the fact (a user message in a
session with no tool role is a text agent's, its task apart), with secret leaks, structure validity (every tool call answered right
after its turn, a user or tool turn last), task kept, and a forbidden path listed in a
digest as written (the rule inverted). real and generated plant and print what they did.

The real3 corpus (fixtures/transcripts/real3: OpenHands' CodeAct agents, AutoGen 0.2 chats,
LangGraph agents) is held out from the tuning of the rules: it is planted by
fixtures/transcripts/plant3.py in wordings of its own and measured and reported as real2
is (with the seed prefix fidelity3). The real4 corpus (fixtures/transcripts/real4: CAMEL
role-playing runs, smolagents runs from the Hugging Face cookbook, ChatDev logs) is held
out the same way: planted by fixtures/transcripts/plant4.py in wordings of its own, with
the seed prefix fidelity4, and reported as real3 is. The real5 corpus
(fixtures/transcripts/real5: ReAct's WebShop runs, crewAI's recorded agent requests,
DSPy's ReAct agents) is held out likewise: planted by fixtures/transcripts/plant5.py in
wordings of its own, with the seed prefix fidelity5, and reported as real3 is. The real6
corpus (fixtures/transcripts/real6: Auto-GPT's recorded challenge runs, Letta's agent
files, an Inspect AI browsing log) is held out likewise: planted by
fixtures/transcripts/plant6.py in wordings of its own, with the seed prefix fidelity6,
and reported as real3 is. The real7 corpus (fixtures/transcripts/real7: FireAct's GPT-4
ReAct trajectories, saved sessions of Google's ADK sample agents, Qwen-Agent's notebook
runs) is held out likewise: planted by fixtures/transcripts/plant7.py in wordings of its
own, with the seed prefix fidelity7, and reported as real3 is. real8 is no new corpus but
a held-out planting: real3's sessions planted again by fixtures/transcripts/plant8.py in
wordings of its own, with the seed prefix fidelity8, and reported as real3 is.

Each planted transcript (chat completions) is compacted offline with

    BIN compact --context-window W FILE      (exit 0 fits, 3 does not fit, 2 bad input)

at W = 25%, 50% and 75% of its own token count and at 1,024 tokens. Per kind of fact it
counts how often the fact is still somewhere in the output when the message that held it
was dropped (the holder counts as kept when a tool result with its call id, or a message
holding a 60-character stretch unique to the holder, is still there). Facts lost from a
holder that was kept but shortened are counted apart.

The facts and the task are also counted over the runs whose request fits its target only:
the upstream refuses a request over its target, so what it holds reaches no model (a change
that makes such a request fit by giving up facts shows as a loss in the raw figure). And
once more over every dropped fact, counted as kept only where its request fits: what
reaches a model, a figure that a change making more requests fit cannot lower by the runs
it brings in.

Also: the task statement (the opening 200 characters of the first user message) survives;
a secret leaks (a 12-character substring of it, outside a whole copy, in text the compactor
wrote, i.e. in an output message that is not byte-identical to an input one: a cut went
through it; or the whole secret inside the digest); requests over target (exit 3;
for Hermes, its output measured by the same binary against the same target); and of those,
the requests over target where a fitting request existed: where the least the proxy
promises to keep fits the target (the instructions, the tool definitions and the latest
user message whole, which the engine never cuts; 48 tokens, its cut floor, for the task
and for each message from the latest calls on (earlier rounds of the turn fold into the
summary); a summary of 64 tokens, its floor, in its frame). Over target beyond that floor is the transcript's, not the
compaction's: a 25,000-character observation as the latest user message, or ToolBench's
system prompt and tool schemas, alone exceed a 25% window.

"Shown to the summariser": at the 25% and 50% windows the transcript is compacted again
with --summarize-via pointing at a mock OpenAI-compatible server on 127.0.0.1 that records
every request; the share of facts of dropped messages found in those requests, and the
runs in which any secret (12-character substring) was in them.

Python 3 standard library only (Hermes runs in its own venv through fidelity_hermes.py).
"""
import argparse
import glob
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "fixtures", "transcripts"))
sys.path.insert(0, HERE)
import plant as planting  # noqa: E402
import plant2  # noqa: E402
import plant3  # noqa: E402
import plant4  # noqa: E402
import plant5  # noqa: E402
import plant6  # noqa: E402
import plant7  # noqa: E402
import plant8  # noqa: E402
import plant9  # noqa: E402
import digest_facts  # noqa: E402

KINDS = ["constraint", "number", "error", "path", "decision"]
HEAD = ["constraint", "number", "error line", "path", "decision"]
SECRETS = ["secret_key", "secret_tok"]
FRACTIONS = [0.25, 0.5, 0.75]
FIXED = [1024]
REPORT = re.compile(r"(\d+) -> (\d+) tokens \(target (\d+), (fits|DOES NOT FIT)\)")


# --- text --------------------------------------------------------------------------------

def text_of(m):
    out = [planting.text_of(m)]
    for c in m.get("tool_calls") or []:
        out.append(c.get("function", {}).get("arguments", ""))
    return "\n".join(out)


def all_text(msgs):
    return "\n".join(text_of(m) for m in msgs)


def windows12(secret):
    return {secret[i:i + 12] for i in range(len(secret) - 11)}


def leaks(secret, text):
    """Any 12 characters of the secret outside a whole copy of it: what is left when a cut
    went through the secret (and took the prefix a redactor knows it by)."""
    return any(w in text.replace(secret, "\0") for w in windows12(secret))


MARKER, END_MARKER = digest_facts.MARKER, digest_facts.END_MARKER


def summary_part(text):
    start = text.find(MARKER)
    if start < 0:
        return ""
    end, _ = digest_facts.find_end(text, start)
    return text[start:] if end < 0 else text[start:end]


# --- corpora -----------------------------------------------------------------------------

def real_corpus():
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "fixtures/transcripts/real/bodies/*.chat.json"))):
        name = os.path.basename(path)[:-len(".chat.json")]
        with open(path) as f:
            body = json.load(f)
        planted, facts = planting.plant(body, f"fidelity:{name}")
        out.append((name, planted, {k: (v["index"], v["text"]) for k, v in facts.items()}))
    return out


def planted_corpus(folder, planter, prefix):
    """A held-apart real corpus (fixtures/transcripts/FOLDER), planted by its own planter
    in its own wordings: each session's slot is its place in name order, so every
    phrasing is used about equally. Entries carry a fourth element: the source, and the
    phrasing of each fact."""
    root = os.path.join(ROOT, "fixtures/transcripts", folder)
    with open(os.path.join(root, "manifest.json")) as f:
        sources = {e["name"]: e["source"] for e in json.load(f)}
    out = []
    for slot, path in enumerate(sorted(glob.glob(os.path.join(root, "bodies/*.chat.json")))):
        name = os.path.basename(path)[:-len(".chat.json")]
        with open(path) as f:
            body = json.load(f)
        planted, facts = planter.plant(body, f"{prefix}:{name}", slot)
        meta = {"source": sources[name], "phrasing": {k: v["phrasing"] for k, v in facts.items()},
                "frame": facts.get("number", {}).get("frame"),
                "subject": facts.get("constraint", {}).get("subject"),
                "with_unit": facts.get("number", {}).get("with_unit")}
        out.append((name, planted, {k: (v["index"], v["text"]) for k, v in facts.items()}, meta))
    return out


# The held-apart corpora: folder, planter, seed prefix (real8 plants real3's sessions again).
PLANTED = {"real2": ("real2", plant2, "fidelity2"), "real3": ("real3", plant3, "fidelity3"),
           "real4": ("real4", plant4, "fidelity4"), "real5": ("real5", plant5, "fidelity5"),
           "real6": ("real6", plant6, "fidelity6"), "real7": ("real7", plant7, "fidelity7"),
           "real8": ("real3", plant8, "fidelity8"), "real9": ("real9", plant9, "fidelity9")}


def generated_corpus(n, steps):
    out = []
    for style in digest_facts.STYLES:
        for i in range(n):
            rng = digest_facts.random.Random(f"{style}-{i}")
            msgs, facts = digest_facts.BUILDERS[style](rng, steps)
            body = {"model": "gpt-4o", "messages": msgs}
            planted, pfacts = planting.plant(body, f"fidelity:{style}-{i}", kinds=SECRETS)
            texts = {k: (holder_of(planted["messages"], fact), fact) for k, (_, fact) in facts.items()}
            texts.update({k: (pfacts[k]["index"], pfacts[k]["text"]) for k in SECRETS})
            out.append((f"{style}-{i}", planted, texts))
    return out


# --- where a fact lives, and whether its message survived ------------------------------

def holder_of(msgs, fact):
    for i, m in enumerate(msgs):
        if fact in text_of(m):
            return i
    return None


HERMES_MARKER = "[CONTEXT COMPACTION"


def outside_summary(text):
    """The text of an output message less any summary in it (ours between its markers,
    Hermes' from its marker to the end of the message)."""
    start = text.find(MARKER)
    if start >= 0:
        end, length = digest_facts.find_end(text, start)
        text = text[:start] + ("" if end < 0 else text[end + length:])
    start = text.find(HERMES_MARKER)
    return text if start < 0 else text[:start]


def held_facts(facts):
    """(kind, index of the message that held it, text) of each fact a transcript carries,
    in KINDS order."""
    for k in KINDS:
        i, fact = facts.get(k, (None, None))
        if i is not None:
            yield k, i, fact


def unique_probe(msgs, i, fact):
    """Up to 60 characters of message i, clear of the fact, found in no other message,
    as near its start as can be (a shortened message keeps its start); the fact itself
    when the message holds little else."""
    others = [text_of(m) for j, m in enumerate(msgs) if j != i]
    for piece in text_of(msgs[i]).split(fact):
        for s in range(0, max(1, len(piece) - 20), 30):
            probe = piece[s:s + 60]
            if len(probe.strip()) >= 20 and not any(probe in o for o in others):
                return probe
    return fact


def holder_kind(src, i):
    """The holder's role as the agent meant it: a user message that follows an assistant's
    call or action is an observation where the agent has no tool role."""
    m = src[i]
    if m["role"] != "user":
        return m["role"]
    if any(x.get("role") == "tool" for x in src):
        return "user"
    first = next(j for j, x in enumerate(src) if x["role"] == "user")
    return "user (task)" if i == first else "user (text agent)"


def holder_kept(src, i, out, probe):
    m = src[i]
    if m["role"] == "tool":
        return any(o.get("role") == "tool" and o.get("tool_call_id") == m["tool_call_id"] for o in out)
    return any(probe in outside_summary(text_of(o)) for o in out)


# --- running -----------------------------------------------------------------------------

# Flags of the compactions measured (not of the calls that only count a body's tokens):
# `--economy` with this script's --economy.
COMPACT_FLAGS = []


def compact(binary, body, window, via=None, flags=()):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(body, f)
        path = f.name
    cmd = [binary, "compact", "--context-window", str(window), *flags, path]
    if via:
        cmd[2:2] = ["--summarize-via", via]
    run = subprocess.run(cmd, capture_output=True, check=False)
    os.unlink(path)
    if run.returncode not in (0, 3):
        raise SystemExit(f"{cmd}: exit {run.returncode}: {run.stderr.decode()}")
    m = REPORT.search(run.stderr.decode())
    before, after, target = (int(x) for x in m.groups()[:3])
    return json.loads(run.stdout)["messages"], run.returncode, before, after, target


class Recorder(http.server.BaseHTTPRequestHandler):
    requests = []
    # A checkpoint the proxy's answer check accepts (headings of its template, a line of
    # its own under each), so that a chunked middle is sent chunk after chunk. Like a
    # model, it writes no more than the request's max_tokens allow (about three characters
    # a token), and at least the two headings the check asks for; every answer is the same
    # first headings, so an update never drops one its previous checkpoint had.
    HEADINGS = ["## Active Task", "## Goal", "## Constraints and Preferences", "## Completed Actions",
                "## Active State", "## In Progress", "## Blockers", "## Key Decisions",
                "## Resolved Questions", "## Pending Asks", "## Relevant Files", "## Remaining Work",
                "## Critical Values"]

    @classmethod
    def answer(cls, max_tokens):
        parts = [f"{h}\n- Mock checkpoint line {i} by the fidelity bench's recorder.\n"
                 for i, h in enumerate(cls.HEADINGS)]
        room, out = 3 * (max_tokens or 10_000), []
        for p in parts:
            if len(out) >= 2 and sum(map(len, out)) + len(p) > room:
                break
            out.append(p)
        return "".join(out)

    def do_POST(self):  # noqa: N802 - http.server's name
        n = int(self.headers.get("content-length", 0))
        body = self.rfile.read(n)
        try:
            req = json.loads(body)
        except json.JSONDecodeError:
            req = {"raw": body.decode("utf-8", "replace")}
        Recorder.requests.append(req)
        content = self.answer(req.get("max_tokens") or req.get("max_completion_tokens"))
        chunk = {"id": "mock", "object": "chat.completion.chunk", "model": "mock",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": content},
                              "finish_reason": None}]}
        done = {"id": "mock", "object": "chat.completion.chunk", "model": "mock",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 60, "total_tokens": 1060}}
        payload = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args):
        pass


def start_mock():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def request_text(req):
    msgs = req.get("messages") or []
    return "\n".join(planting.text_of(m) for m in msgs) if msgs else json.dumps(req)


# --- scoring -----------------------------------------------------------------------------

class Tally:
    def __init__(self):
        self.kept = {k: [0, 0] for k in KINDS}   # kept, dropped
        self.sent = {k: [0, 0] for k in KINDS}   # kept in a request that fits, dropped
        self.cut = {k: [0, 0] for k in KINDS}    # lost, kept holder
        self.task = [0, 0]
        self.leak = [0, 0]
        self.over = [0, 0]
        self.over_fitting = [0, 0]  # over target, runs whose floor fits

    def count_over(self, over, floor, target):
        self.over[1] += 1
        self.over[0] += int(over)
        if floor <= target:
            self.over_fitting[1] += 1
            self.over_fitting[0] += int(over)

    def pct(self, k, table=None):
        kept, n = (table or self.kept)[k]
        return f"{100 * kept // n}% ({kept}/{n})" if n else "n/a"


def score(src, facts, out, tally, details, label, fits=True):
    """Scores one run: src the planted transcript, out the compacted messages, `fits`
    whether the request fits its target (else it reaches no model)."""
    text = all_text(out)
    src_texts = {text_of(m) for m in src}
    # Text the compactor wrote: every output message not byte-identical to an input one
    # (shortened, merged, placeholders, the digest). A whole secret copied from the
    # client's own message is not counted, unless it sits in the digest.
    written = "\n".join(text_of(m) for m in out if text_of(m) not in src_texts)
    digest = "\n".join(summary_part(text_of(m)) for m in out)
    rec = {"run": label, "dropped": {}, "cut": {}}
    for k, i, fact in held_facts(facts):
        probe = unique_probe(src, i, fact)
        present = fact in text
        if holder_kept(src, i, out, probe):
            tally.cut[k][1] += 1
            if not present:
                tally.cut[k][0] += 1
                rec["cut"][k] = fact
        else:
            tally.kept[k][1] += 1
            tally.kept[k][0] += int(present)
            tally.sent[k][1] += 1
            tally.sent[k][0] += int(present and fits)
            rec["dropped"][k] = {"fact": fact, "kept": present, "holder": holder_kind(src, i)}
    first = next(m for m in src if m["role"] == "user")
    opening = planting.text_of(first).strip()[:200]
    tally.task[1] += 1
    tally.task[0] += int(opening in text)
    rec["task_kept"] = opening in text
    tally.leak[1] += 1
    leaked = [s for s in SECRETS if s in facts and (leaks(facts[s][1], written) or facts[s][1] in digest)]
    tally.leak[0] += int(bool(leaked))
    rec["leaked"] = leaked
    details.append(rec)
    return rec


CUT_FLOOR = 48  # tokens: the engine never cuts a message below this
SUMMARY_FLOOR = 64  # tokens: nor a summary
SUMMARY_FRAME = (MARKER + "\nEarlier turns were removed to fit the context window. These notes digest "
                 "them for reference, not as a new request: build on this state and answer the latest "
                 "message below.\n\n" + END_MARKER)


def floor_tokens(binary, body):
    """The least the proxy promises to keep of a request: its instructions and tools, the
    latest user message whole, and for each other message it keeps the cut floor (the
    task, a summary at its own floor in its frame, each message after the latest user
    message)."""
    msgs = body["messages"]
    latest = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    first = next(i for i, m in enumerate(msgs) if m["role"] == "user")
    keep = [m for m in msgs[:latest] if m["role"] in ("system", "developer")]
    if first < latest:
        keep.append({"role": "assistant", "content": SUMMARY_FRAME})
    keep.append(msgs[latest])
    _, _, tokens, _, _ = compact(binary, dict(body, messages=keep), 10_000_000)
    # After the latest user message, the engine folds the turn's earlier rounds of calls
    # into the summary and keeps the latest calls and their results.
    calls = [i for i, m in enumerate(msgs) if i > latest and m.get("tool_calls")]
    after = len(msgs) - (calls[-1] if calls else latest + 1)
    floors = after + (first < latest)
    return tokens + CUT_FLOOR * floors + (SUMMARY_FLOOR if first < latest else 0)


def structure_ok(msgs):
    """A request an OpenAI-compatible upstream accepts: known roles, every tool call
    answered by tool messages right after its assistant turn, every tool message
    answering an open call, and a user or tool turn last."""
    open_ids = []
    for m in msgs:
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return False
        if open_ids and role != "tool":
            return False
        if role == "tool":
            if m.get("tool_call_id") not in open_ids:
                return False
            open_ids.remove(m["tool_call_id"])
        if role == "assistant":
            open_ids = [c.get("id") for c in m.get("tool_calls") or []]
    return not open_ids and bool(msgs) and msgs[-1].get("role") in ("user", "tool")


def inverted(subject, msgs, src=()):
    """The forbidden path listed in a digest as one written (the opposite of the rule). A
    line that quotes the user's own sentence about it (a request the digest kept, in the
    words of the source's user message) says the rule, whatever its wording."""
    if not subject:
        return False
    texts = [text_of(m) for m in msgs]
    digest = "\n".join(summary_part(t) + ("\n" + t[t.find(HERMES_MARKER):] if HERMES_MARKER in t else "")
                       for t in texts)
    subject = subject.rstrip("/")
    said = [text_of(m) for m in src if m.get("role") == "user"]

    def quoted(line):
        body = line[2:] if line.startswith("- ") else line
        sentence = next((s for s in re.split(r"(?<=[.!?;])\s+", body) if subject in s), body).strip()
        return len(sentence) > len(subject) + 10 and any(sentence in t for t in said)

    return any(subject in line and re.search(r"\b(wr[io]te|written|edited|modified)\b", line.replace(subject, ""), re.I)
               and not re.search(r"\b(never|not|don't|off-limits|alone|forbidden|hands off|stay)\b",
                                 line.replace(subject, ""), re.I)
               and not quoted(line)
               for line in digest.splitlines())


def breakdown(meta, out, wname, src):
    """What the per-source and per-phrasing tables need of a run (real2); `src` the planted
    transcript."""
    return {"source": meta["source"], "phrasing": meta["phrasing"], "frame": meta["frame"], "wname": wname,
            "structure_ok": structure_ok(out), "inverted": inverted(meta["subject"], out, src),
            "unit_kept": bool(meta["with_unit"]) and meta["with_unit"] in all_text(out)}


def run_corpus(name, corpus, args, details):
    ours, hermes, shown = Tally(), Tally(), Tally()
    # The same runs less those whose request stays over its target: the upstream refuses
    # such a request, so the facts it holds reach no model.
    fitting = Tally()
    shown_secret = [0, 0]
    by_window, fitting_by_window = {}, {}
    jobs = []
    server, url = start_mock()
    for entry in corpus:
        tname, body, facts = entry[:3]
        meta = entry[3] if len(entry) > 3 else None
        _, _, tokens, _, _ = compact(args.binary, body, 10_000_000)
        floor = floor_tokens(args.binary, body)
        wins = [(f"{int(fr * 100)}%", max(256, int(tokens * fr))) for fr in FRACTIONS] + \
               [(str(w), w) for w in FIXED]
        for wname, w in wins:
            out, rc, _, after, target = compact(args.binary, body, w, flags=COMPACT_FLAGS)
            ours.count_over(rc == 3, floor, target)
            t = by_window.setdefault(wname, Tally())
            t.count_over(rc == 3, floor, target)
            rec = score(body["messages"], facts, out, ours, details, f"{name}/{tname}/ours/{wname}",
                        rc == 0)
            score(body["messages"], facts, out, t, [], "", rc == 0)
            if rc == 0:
                score(body["messages"], facts, out, fitting, [], "")
                score(body["messages"], facts, out, fitting_by_window.setdefault(wname, Tally()), [], "")
            rec.update(window=w, tokens=tokens, after=after, target=target, rc=rc, floor=floor)
            if meta:
                rec.update(breakdown(meta, out, wname, body["messages"]))
            jobs.append({"messages": body["messages"], "window": w, "facts": facts, "name": tname,
                         "wname": wname, "target": target, "floor": floor, "meta": meta})
            # the held-apart corpora (meta) are shown to the summariser at every window; the table's own
            # figure stays the 25% and 50% windows' of every corpus.
            standard = wname in ("25%", "50%")
            if standard or meta:
                Recorder.requests = []
                sout, _, _, _, _ = compact(args.binary, body, w, via=url, flags=COMPACT_FLAGS)
                shown_text = "\n".join(request_text(r) for r in Recorder.requests)
                srec = {"run": f"{name}/{tname}/shown/{wname}", "requests": len(Recorder.requests),
                        "dropped": {}}
                if Recorder.requests:
                    # What was dropped in this run; were its facts in what the summariser saw?
                    for k, i, fact in held_facts(facts):
                        if not holder_kept(body["messages"], i, sout, unique_probe(body["messages"], i, fact)):
                            seen = fact in shown_text
                            if standard:
                                shown.kept[k][1] += 1
                                shown.kept[k][0] += int(seen)
                            srec["dropped"][k] = {"fact": fact, "shown": seen}
                    leaked = [s for s in SECRETS if s in facts
                              and (leaks(facts[s][1], shown_text) or facts[s][1] in shown_text)]
                    if standard:
                        shown_secret[1] += 1
                        shown_secret[0] += int(bool(leaked))
                    srec["secret_shown"] = leaked
                if meta:
                    srec.update(breakdown(meta, sout, wname, body["messages"]))
                details.append(srec)
    server.shutdown()
    if args.hermes_python:
        with tempfile.TemporaryDirectory() as d:
            jp, op = os.path.join(d, "jobs.json"), os.path.join(d, "out.json")
            with open(jp, "w") as f:
                json.dump([{"messages": j["messages"], "window": j["window"]} for j in jobs], f)
            subprocess.run([args.hermes_python, os.path.join(HERE, "fidelity_hermes.py"), jp, op], check=True)
            with open(op) as f:
                results = json.load(f)
        for j, res in zip(jobs, results):
            label = f"{name}/{j['name']}/hermes/{j['wname']}"
            if "error" in res:
                details.append({"run": label, "error": res["error"]})
                continue
            rec = score(j["messages"], j["facts"], res["messages"], hermes, details, label)
            _, _, size, _, _ = compact(args.binary, {"model": "gpt-4o", "messages": res["messages"]}, 10_000_000)
            hermes.count_over(size > j["target"], j["floor"], j["target"])
            rec.update(after=size, target=j["target"], fallback=res.get("fallback"))
            if j["meta"]:
                rec.update(breakdown(j["meta"], res["messages"], j["wname"], j["messages"]))
    return ours, fitting, hermes, shown, shown_secret, by_window, fitting_by_window


def frac(pair):
    a, n = pair
    return f"{100 * a // n}% ({a}/{n})" if n else "n/a"


def print_tables(name, count, ours, fitting, hermes, shown, shown_secret, by_window, fitting_by_window,
                 have_hermes):
    print(f"### {name} corpus: {count} transcripts, windows 25/50/75% of each and 1,024 tokens\n")
    print("| kept when its message was dropped | " + " | ".join(HEAD) + " |")
    print("| --- |" + " --- |" * len(HEAD))
    print("| our deterministic digest | " + " | ".join(ours.pct(k) for k in KINDS) + " |")
    print("| our deterministic digest, requests that fit only | "
          + " | ".join(fitting.pct(k) for k in KINDS) + " |")
    print("| our deterministic digest, kept in a request that fits, of every dropped fact | "
          + " | ".join(ours.pct(k, ours.sent) for k in KINDS) + " |")
    if have_hermes:
        print("| Hermes Agent's compressor (no model, its static fallback), same transcripts | "
              + " | ".join(hermes.pct(k) for k in KINDS) + " |")
    print("| shown to our LLM summariser (in its request), 25% and 50% windows | "
          + " | ".join(shown.pct(k) for k in KINDS) + " |")
    print()
    print("| also | ours | Hermes |")
    print("| --- | --- | --- |")
    h = (lambda p: frac(p)) if have_hermes else (lambda p: "not run")
    print(f"| task statement (opening of the first user message) survives | {frac(ours.task)} | {h(hermes.task)} |")
    print(f"| task statement survives, requests that fit only | {frac(fitting.task)} | |")
    print(f"| runs where a secret's 12+ chars reach text the compactor wrote | {frac(ours.leak)} | {h(hermes.leak)} |")
    print(f"| requests over target | {frac(ours.over)} | {h(hermes.over)} |")
    print(f"| requests over target where a fitting request existed | {frac(ours.over_fitting)} | "
          f"{h(hermes.over_fitting)} |")
    print("| facts lost from a message that was kept (shortened) | "
          + frac([sum(ours.cut[k][0] for k in KINDS), sum(ours.cut[k][1] for k in KINDS)]) + " | "
          + (frac([sum(hermes.cut[k][0] for k in KINDS), sum(hermes.cut[k][1] for k in KINDS)]) if have_hermes else "not run")
          + " |")
    print(f"| summariser runs whose request held a secret (12+ chars) | {frac(shown_secret)} | |")
    print()
    print("| our digest, by window | " + " | ".join(HEAD) + " | task | over target | over, a fitting one existed |")
    print("| --- |" + " --- |" * (len(HEAD) + 3))
    for w, t in by_window.items():
        print(f"| {w} | " + " | ".join(t.pct(k) for k in KINDS)
              + f" | {frac(t.task)} | {frac(t.over)} | {frac(t.over_fitting)} |")
    print()
    print("| our digest, requests that fit only, by window | " + " | ".join(HEAD) + " | task |")
    print("| --- |" + " --- |" * (len(HEAD) + 1))
    for w in by_window:
        t = fitting_by_window.get(w, Tally())
        print(f"| {w} | " + " | ".join(t.pct(k) for k in KINDS) + f" | {frac(t.task)} |")
    print()
    print("| our digest, kept in a request that fits, of every dropped fact, by window | "
          + " | ".join(HEAD) + " |")
    print("| --- |" + " --- |" * len(HEAD))
    for w, t in by_window.items():
        print(f"| {w} | " + " | ".join(t.pct(k, t.sent) for k in KINDS) + " |")
    print()


class Tee:
    """stdout that also goes to a file (--out)."""
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def _p(pair):
    a, n = pair
    return f"{100 * a // n}% ({a}/{n})" if n else "n/a"


def print_breakdown(name, details, have_hermes):
    """The real2 tables: per window, per source and per phrasing, ours beside Hermes and
    what the summariser was shown (at every window for this corpus)."""
    runs = {"ours": [], "hermes": [], "shown": []}
    for d in details:
        parts = d.get("run", "").split("/")
        if len(parts) == 4 and parts[0] == name and "source" in d:
            runs[parts[2]].append(d)

    def count(recs, key, pred=lambda d: True, field="kept"):
        """[kept, dropped] of kind key over recs that pass pred."""
        c = [0, 0]
        for d in recs:
            if pred(d) and key in d.get("dropped", {}):
                c[1] += 1
                c[0] += int(d["dropped"][key][field])
        return c

    def share(recs, f, pred=lambda d: True):
        sel = [d for d in recs if pred(d)]
        return [sum(1 for d in sel if f(d)), len(sel)]

    leak = lambda d: bool(d.get("leaked"))  # noqa: E731
    h = (lambda x: x) if have_hermes else (lambda x: "not run")
    windows = list(dict.fromkeys(d["wname"] for d in runs["ours"]))
    print(f"### {name}: by window (kept when dropped: ours / Hermes; shown: in the summariser's requests)\n")
    print("| window | who | " + " | ".join(HEAD) + " | secret leaked | structure valid | task kept | forbidden path listed as written |")
    print("| --- | --- |" + " --- |" * (len(HEAD) + 4))
    for w in windows:
        at = lambda d, w=w: d["wname"] == w  # noqa: E731
        print(f"| {w} | ours | " + " | ".join(_p(count(runs["ours"], k, at)) for k in KINDS)
              + f" | {_p(share(runs['ours'], leak, at))} | {_p(share(runs['ours'], lambda d: d['structure_ok'], at))}"
              f" | {_p(share(runs['ours'], lambda d: d['task_kept'], at))} | {_p(share(runs['ours'], lambda d: d['inverted'], at))} |")
        print(f"| {w} | shown to summariser | " + " | ".join(_p(count(runs["shown"], k, at, "shown")) for k in KINDS)
              + f" | {_p(share(runs['shown'], lambda d: bool(d.get('secret_shown')), at))} (secret in request) | | | |")
        if have_hermes:
            print(f"| {w} | Hermes | " + " | ".join(_p(count(runs["hermes"], k, at)) for k in KINDS)
                  + f" | {_p(share(runs['hermes'], leak, at))} | {_p(share(runs['hermes'], lambda d: d['structure_ok'], at))}"
                  f" | {_p(share(runs['hermes'], lambda d: d['task_kept'], at))} | {_p(share(runs['hermes'], lambda d: d['inverted'], at))} |")
    print()
    print(f"### {name}: by source, all four windows\n")
    print("| source | who | " + " | ".join(HEAD) + " | secret leaked | structure valid | task kept | forbidden path listed as written |")
    print("| --- | --- |" + " --- |" * (len(HEAD) + 4))
    for src in sorted({d["source"] for d in runs["ours"]}):
        of = lambda d, src=src: d["source"] == src  # noqa: E731
        for who, field in (("ours", "kept"), ("shown", "shown"), ("hermes", "kept")):
            if who == "hermes" and not have_hermes:
                continue
            recs = runs[who]
            row = " | ".join(_p(count(recs, k, of, field)) for k in KINDS)
            if who == "shown":
                tail = f" | {_p(share(recs, lambda d: bool(d.get('secret_shown')), of))} (secret in request) | | | |"
            else:
                tail = (f" | {_p(share(recs, leak, of))} | {_p(share(recs, lambda d: d['structure_ok'], of))}"
                        f" | {_p(share(recs, lambda d: d['task_kept'], of))} | {_p(share(recs, lambda d: d['inverted'], of))} |")
            print(f"| {src} | {'shown to summariser' if who == 'shown' else who} | {row}{tail}")
    print()
    print(f"### {name}: by the role of the message that held the fact (ours, kept when dropped)\n")
    print("| kind | holder | all four windows | " + " | ".join(windows) + " |")
    print("| --- | --- | --- |" + " --- |" * len(windows))
    for k in KINDS:
        for holder in sorted({d["dropped"][k].get("holder") for d in runs["ours"] if k in d.get("dropped", {})}):
            of = lambda d, k=k, holder=holder: d["dropped"].get(k, {}).get("holder") == holder  # noqa: E731
            per_w = " | ".join(_p(count(runs["ours"], k, lambda d, w=w, of=of: of(d) and d["wname"] == w))
                               for w in windows)
            print(f"| {k} | {holder} | {_p(count(runs['ours'], k, of))} | {per_w} |")
    print()
    print(f"### {name}: by phrasing, all four windows (kept when dropped, ours; shown to the summariser; Hermes)\n")
    print("| kind | phrasing | ours | shown to summariser | Hermes | ours at 25% | ours at 50% | ours at 75% | ours at 1024 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in KINDS:
        for ph in sorted({d["phrasing"].get(k) for d in runs["ours"] if d["phrasing"].get(k)}):
            of = lambda d, k=k, ph=ph: d["phrasing"].get(k) == ph  # noqa: E731
            per_w = " | ".join(_p(count(runs["ours"], k, lambda d, w=w, of=of: of(d) and d["wname"] == w))
                               for w in windows)
            print(f"| {k} | {ph} | {_p(count(runs['ours'], k, of))} | {_p(count(runs['shown'], k, of, 'shown'))} | "
                  f"{h(_p(count(runs['hermes'], k, of)))} | {per_w} |")
    print()
    print(f"### {name}: constraint and number by the interjection's frame (ours, all four windows)\n")
    print("| frame | constraint | number | number with its unit as written |")
    print("| --- | --- | --- | --- |")
    unit = lambda recs, pred: share([d for d in recs if "number" in d.get("dropped", {})],  # noqa: E731
                                    lambda d: d["unit_kept"], pred)
    for fr in sorted({d["frame"] for d in runs["ours"] if d["frame"]}):
        of = lambda d, fr=fr: d["frame"] == fr  # noqa: E731
        print(f"| {fr} | {_p(count(runs['ours'], 'constraint', of))} | {_p(count(runs['ours'], 'number', of))} | "
              f"{_p(unit(runs['ours'], of))} |")
    print(f"| all | {_p(count(runs['ours'], 'constraint'))} | {_p(count(runs['ours'], 'number'))} | "
          f"{_p(unit(runs['ours'], lambda d: True))} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default="target/debug/compaction-proxy")
    default_hermes = os.path.expanduser("~/.cache/compaction-proxy-bench/hermes-0.19.0/bin/python")
    ap.add_argument("--hermes-python", default=default_hermes if os.path.exists(default_hermes) else None,
                    help="python of a venv with hermes-agent (bench/peers.sh installs one); "
                         "'' to skip Hermes")
    ap.add_argument("--corpora", default="real,generated")
    ap.add_argument("--generated-n", type=int, default=10, help="generated transcripts per style")
    ap.add_argument("--generated-steps", type=int, default=60)
    ap.add_argument("--details", help="write one JSON line per run here")
    ap.add_argument("--economy", action="store_true",
                    help="economy mode first (`compact --economy`): the facts kept with it on")
    ap.add_argument("--out", help="also write the tables to this file")
    args = ap.parse_args()
    if args.economy:
        COMPACT_FLAGS.append("--economy")
    if args.out:
        sys.stdout = Tee(sys.stdout, open(args.out, "w"))
    details = []
    for name in args.corpora.split(","):
        if name == "real":
            corpus = real_corpus()
        elif name in PLANTED:
            corpus = planted_corpus(*PLANTED[name])
        else:
            corpus = generated_corpus(args.generated_n, args.generated_steps)
        res = run_corpus(name, corpus, args, details)
        print_tables(name, len(corpus), *res, have_hermes=bool(args.hermes_python))
        if name in PLANTED:
            print_breakdown(name, details, have_hermes=bool(args.hermes_python))
        sys.stdout.flush()
    if args.details:
        with open(args.details, "w") as f:
            for d in details:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
