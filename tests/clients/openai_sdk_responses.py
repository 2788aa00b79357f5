"""A long agent session through compaction-proxy with the openai Python SDK's Responses
API (`client.responses.create`), streamed and not.

The upstream (the test's mock) has a small context window; the `input` items grow past
it within a few turns. The SDK must never see an error: the proxy compacts and retries.
Exits non-zero with a message on the first surprise.
"""

import json
import sys

import openai
from session_tool import arguments, output, tool

TURNS = 20
HEADERS = {"x-mock": "window", "x-mock-shape": "responses", "x-mock-window": "3000"}


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def session(client, stream):
    items = []
    compacted = 0
    for turn in range(1, TURNS + 1):
        call_id = f"call_{turn}"
        items.append({"role": "user", "content": f"Turn {turn}: look at notes_{turn}.txt"})
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": tool(),
                "arguments": arguments(turn),
            }
        )
        items.append({"type": "function_call_output", "call_id": call_id, "output": output(turn)})
        try:
            raw = client.responses.with_raw_response.create(
                model="mock-agent-model",
                instructions="You are a coding agent. Be brief.",
                input=items,
                stream=stream,
            )
            if raw.headers.get("x-compaction", "").startswith("applied"):
                compacted += 1
            parsed = raw.parse()
            if stream:
                text = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
            else:
                text = parsed.output_text
        except openai.APIError as error:
            fail(f"turn {turn} (stream={stream}): {error!r}")
        if not text.startswith("MOCK-RESPONSE"):
            fail(f"turn {turn} (stream={stream}): unexpected reply {text!r}")
        items.append({"role": "assistant", "content": text})
    if compacted == 0:
        fail(f"stream={stream}: no turn was compacted: the window was never reached")
    return compacted


def main():
    client = openai.OpenAI(api_key="sk-test", max_retries=0, default_headers=HEADERS)
    done = [session(client, stream) for stream in (False, True)]
    print(f"{TURNS} turns twice, {done} compacted, no error seen by the SDK")


if __name__ == "__main__":
    main()
