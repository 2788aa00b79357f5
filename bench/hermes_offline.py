"""Hermes Agent cut off from any summary model, for the benchmarks that run its
ContextCompressor (hermes_compress.py, fidelity_hermes.py): sockets refuse to connect in
this process, HERMES_HOME is an empty directory (no provider configured) and no
`*_API_KEY` or `*_BASE_URL` is left in the environment, so compress() takes its static
fallback. One place, so that the two benchmarks cannot drift apart on what they block.

Call sandbox() before anything from Hermes is imported: it reads its home and keys then.
"""
import logging
import os
import socket
import tempfile


def refuse(*_args, **_kwargs):
    raise ConnectionRefusedError("network disabled by the benchmark: no summary model")


def sandbox(name):
    """Blocks the network and the keys; Hermes' home goes to a fresh hermes-NAME-* folder."""
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    os.environ["HERMES_HOME"] = tempfile.mkdtemp(prefix=f"hermes-{name}-")
    for key in list(os.environ):
        if key.endswith("_API_KEY") or key.endswith("_BASE_URL"):
            del os.environ[key]
    logging.disable(logging.CRITICAL)
