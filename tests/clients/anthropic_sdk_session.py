"""A long agent session through compaction-proxy with the official anthropic Python SDK.

Usage: anthropic_sdk_session.py tools | thinking-stream

`tools`: `client.messages.create` with a tool; the script plays the tool loop, answering
each `tool_use` with a `tool_result` holding a long build log, so the history grows past
the upstream's (the test's mock's) small window within a few turns.
`thinking-stream`: the same loop streamed with `client.messages.stream`, with extended
thinking enabled: every answer opens with a signed thinking block, which goes back to
the upstream on the next request as the SDK received it.

The base URL is the proxy's (`ANTHROPIC_BASE_URL`, without `/v1`, which the SDK reads
itself) and the key a dummy (`SDK_API_KEY`, in sidecar mode one of the proxy's keys). The SDK must never see an error: the proxy compacts and
retries. Exits non-zero with a message on the first surprise; otherwise prints a
`REPORT {json}` line for the test: turns and requests made, how many the proxy compacted
(its `x-compaction` header), the size of the history the SDK holds, and every thinking
block the SDK received, in order.
"""

import json
import os
import sys

import anthropic

TURNS = 16
WINDOW = 6000
# How the upstream refuses an overlong request: `MOCK_SHAPE`, as the mock's `x-mock-shape`.
SHAPE = os.environ.get("MOCK_SHAPE", "anthropic")
HEADERS = {"x-mock": "window", "x-mock-window": str(WINDOW), "x-mock-shape": SHAPE, "x-mock-tools": "call"}
MODEL = "claude-sonnet-4-5"
SYSTEM = "You are a build assistant. Read the logs you are pointed at, then say what failed."
TOOLS = [
    {
        "name": "read_log",
        "description": "Read a build log.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def build_log(turn, path):
    """About 1,200 of the mock's tokens: a few turns of these outgrow its window."""
    lines = "".join(f"[{turn}:{i:03}] compiling crate_{i} for {path} ... ok\n" for i in range(80))
    return f"{lines}error[E0599]: no method named `frobnicate` found (turn {turn})\n"


class Session:
    def __init__(self, mode):
        key = os.environ.get("SDK_API_KEY", "sk-ant-dummy")
        self.client = anthropic.Anthropic(api_key=key, max_retries=0, default_headers=HEADERS)
        self.stream = mode == "thinking-stream"
        self.messages = []
        self.requests = 0
        self.compacted = 0
        self.thinking = []

    def ask(self, turn):
        """One request; the assistant's message, added to the history."""
        self.requests += 1
        params = {"model": MODEL, "max_tokens": 2048, "system": SYSTEM, "tools": TOOLS, "messages": self.messages}
        try:
            if self.stream:
                params["thinking"] = {"type": "enabled", "budget_tokens": 1024}
                with self.client.messages.stream(**params) as stream:
                    headers = stream.response.headers
                    message = stream.get_final_message()
            else:
                raw = self.client.messages.with_raw_response.create(**params)
                headers = raw.headers
                message = raw.parse()
        except anthropic.APIError as error:
            fail(f"turn {turn}, request {self.requests}: {error!r}")
        if headers.get("x-compaction", "").startswith("applied"):
            self.compacted += 1
        if self.stream:
            first = message.content[0]
            if first.type != "thinking" or not first.signature:
                fail(f"turn {turn}: no signed thinking block first: {message.content!r}")
            self.thinking.append({"thinking": first.thinking, "signature": first.signature})
        # As the SDK's documentation does it: the content blocks go back as they came.
        self.messages.append({"role": "assistant", "content": message.content})
        return message

    def turn(self, turn):
        self.messages.append({"role": "user", "content": f"Turn {turn}: what failed in this build?"})
        message = self.ask(turn)
        calls = [block for block in message.content if block.type == "tool_use"]
        if message.stop_reason != "tool_use" or not calls:
            fail(f"turn {turn}: expected a tool call, got {message.stop_reason}: {message.content!r}")
        results = [
            {"type": "tool_result", "tool_use_id": call.id, "content": build_log(turn, call.input["path"])}
            for call in calls
        ]
        self.messages.append({"role": "user", "content": results})
        message = self.ask(turn)
        text = "".join(block.text for block in message.content if block.type == "text")
        if message.stop_reason != "end_turn" or not text.startswith("MOCK-MESSAGE"):
            fail(f"turn {turn}: unexpected answer {message.stop_reason}: {message.content!r}")

    def history_chars(self):
        def plain(value):
            return value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value

        return len(json.dumps(self.messages, default=plain))


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("tools", "thinking-stream"):
        fail(__doc__)
    session = Session(sys.argv[1])
    for turn in range(1, TURNS + 1):
        session.turn(turn)
    report = {
        "sdk": anthropic.__version__,
        "turns": TURNS,
        "requests": session.requests,
        "compacted": session.compacted,
        "history_chars": session.history_chars(),
        "thinking": session.thinking,
    }
    print("REPORT " + json.dumps(report))
    print(f"{TURNS} turns, {session.requests} requests, {session.compacted} compacted, no error seen by the SDK")


if __name__ == "__main__":
    main()
