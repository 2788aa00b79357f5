"""What the session scripts' one tool answers, in either SDK session: a note it read, or
with SESSION_OUTPUT=log the log of a build it ran (what economy mode shortens once old)."""

import json
import os


def logs():
    return os.environ.get("SESSION_OUTPUT") == "log"


def output(turn):
    """The tool's output: a note it read, or with SESSION_OUTPUT=log the log of a build
    it ran, 60 steps with one warning and its summary line (what economy mode shortens
    once it is old)."""
    if not logs():
        return f"note {turn}: " + "lorem ipsum " * 120
    lines = [f"step {i}: compiling module_{turn}_{i} ... ok" for i in range(60)]
    lines.insert(30, f"warning: unused variable `x` in module_{turn}_30")
    return "\n".join(lines + [f"build {turn}: 60 steps, 1 warning"])


def tool():
    return "run_build" if logs() else "read_file"


def arguments(turn):
    if logs():
        return json.dumps({"target": f"module_{turn}"})
    return json.dumps({"path": f"notes_{turn}.txt"})
