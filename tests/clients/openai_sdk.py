"""The official openai Python SDK talking to compaction-proxy.

Run by tests/suite/real_clients.rs with OPENAI_BASE_URL pointing at the proxy (which points
at the test's mock upstream). Exits non-zero with a message on the first surprise.
"""

import asyncio
import os
import sys

import openai

MODEL = "gpt-4o-mini"


def check(condition, message):
    if not condition:
        print(f"FAIL: {message}", file=sys.stderr)
        sys.exit(1)


def main():
    check(os.environ.get("OPENAI_BASE_URL"), "OPENAI_BASE_URL is not set")
    client = openai.OpenAI(api_key="sk-test", default_headers={"x-mock": "openai"}, max_retries=0)

    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "ping"}]
    )
    check(reply.choices[0].message.content == "you said: ping", f"non-streaming reply: {reply}")
    check(reply.usage.total_tokens == 15, f"usage: {reply.usage}")

    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "stream please"}]}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    check(text == "you said: stream please", f"streamed text: {text!r}")
    check(usage is not None and usage.total_tokens == 15, f"streamed usage: {usage}")

    models = [m.id for m in client.models.list()]
    check(models == ["mock-model"], f"models: {models}")

    async def concurrent():
        aclient = openai.AsyncOpenAI(api_key="sk-test", default_headers={"x-mock": "openai"}, max_retries=0)
        replies = await asyncio.gather(
            *[
                aclient.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"n{i}"}])
                for i in range(8)
            ]
        )
        return [r.choices[0].message.content for r in replies]

    answers = asyncio.run(concurrent())
    check(answers == [f"you said: n{i}" for i in range(8)], f"async answers: {answers}")
    print(f"openai {openai.__version__}: chat, streaming chat, models and async chat all fine")


if __name__ == "__main__":
    main()
