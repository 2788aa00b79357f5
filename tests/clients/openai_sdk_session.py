"""A long streaming agent session through compaction-proxy with the openai Python SDK.

The upstream (the test's mock) has a small context window; the history grows past it
within a few turns. The SDK must never see an error: the proxy compacts and retries.
Exits non-zero with a message on the first surprise.
"""

import json
import sys

import openai
from session_tool import arguments, output, tool

TURNS = 30
HEADERS = {"x-mock": "window", "x-mock-shape": "openai", "x-mock-window": "3000"}


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    client = openai.OpenAI(api_key="sk-test", max_retries=0, default_headers=HEADERS)
    messages = [{"role": "system", "content": "You are a coding agent. Be brief."}]
    compacted = 0
    for turn in range(1, TURNS + 1):
        messages.append({"role": "user", "content": f"Turn {turn}: look at notes_{turn}.txt"})
        call_id = f"call_{turn}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": tool(), "arguments": arguments(turn)},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output(turn)})
        try:
            with client.chat.completions.with_streaming_response.create(
                model="mock-agent-model",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            ) as response:
                if response.headers.get("x-compaction", "").startswith("applied"):
                    compacted += 1
                text = ""
                for chunk in response.parse():
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
        except openai.APIError as error:
            fail(f"turn {turn}: {error!r}")
        if f"Turn {turn}: look at notes_{turn}.txt" not in text:
            fail(f"turn {turn}: unexpected reply {text!r}")
        messages.append({"role": "assistant", "content": text})
    if compacted == 0:
        fail("no turn was compacted: the window was never reached")
    print(f"{TURNS} streaming turns, {compacted} compacted, no error seen by the SDK")


if __name__ == "__main__":
    main()
