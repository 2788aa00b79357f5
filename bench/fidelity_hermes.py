#!/usr/bin/env python3
"""Hermes Agent's ContextCompressor on the transcripts bench/fidelity.py hands it, with no
summary model, so that it takes its static fallback (as bench/hermes_compress.py does).

    HERMES_VENV/bin/python bench/fidelity_hermes.py JOBS.json OUT.json

JOBS.json is a list of {"messages": [...], "window": N}; OUT.json gets the compressed
message list of each job, in order (or {"error": "..."} where compress() raised). Each
job gets a fresh compressor whose context length is the job's window, so that Hermes
aims at what compaction-proxy aims at in the same run.
"""
import copy
import json
import sys
import time

import hermes_offline  # beside this script

hermes_offline.sandbox("fidelity")

from agent.context_compressor import ContextCompressor  # noqa: E402


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    out = []
    for job in jobs:
        c = ContextCompressor(model="gpt-4o", quiet_mode=True, config_context_length=job["window"])
        # Start in the summary cooldown, as on any compaction after the first of a
        # session without a summary model: the static fallback, without a doomed call.
        c._summary_failure_cooldown_until = time.monotonic() + 1e9
        try:
            res = c.compress(copy.deepcopy(job["messages"]), force=False)
            out.append({"messages": res, "fallback": bool(getattr(c, "_last_summary_fallback_used", False))})
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            out.append({"error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
