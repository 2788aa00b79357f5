"""A long session of the openai-agents SDK, with its default model (the Responses API),
through compaction-proxy. The upstream (the test's mock) has a small window that the
history outgrows within a few turns; the SDK must never see an error.
"""

import asyncio
import sys

from agents import Agent, Runner, set_default_openai_client, set_tracing_disabled
from openai import AsyncOpenAI

TURNS = 12
HEADERS = {"x-mock": "window", "x-mock-shape": "responses", "x-mock-window": "6000"}


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


async def main():
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(api_key="sk-test", max_retries=0, default_headers=HEADERS))
    agent = Agent(name="reviewer", instructions="You review build logs. Be brief.")
    history = []
    for turn in range(1, TURNS + 1):
        log = f"line {turn}: compiling module_{turn} ... warning: unused variable\n" * 40
        history.append({"role": "user", "content": f"Turn {turn}: what failed?\n{log}"})
        try:
            result = await Runner.run(agent, history)
        except Exception as error:  # the SDK's errors have no common base worth naming
            fail(f"turn {turn}: {error!r}")
        if "MOCK-RESPONSE" not in str(result.final_output):
            fail(f"turn {turn}: unexpected reply {result.final_output!r}")
        history = result.to_input_list()
    print(f"{TURNS} turns, no error seen by the SDK")


asyncio.run(main())
