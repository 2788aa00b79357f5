#!/usr/bin/env python3
"""Writes the rank tables src/engine/bpe.rs embeds, from OpenAI's published rank lists.

Usage: scripts/tokenizer-tables.py o200k_base.tiktoken cl100k_base.tiktoken [...]
(plain or gzipped; the files tiktoken downloads from openaipublic.blob.core.windows.net).
Each NAME.tiktoken becomes data/tokenizers/NAME.ranks:

    u32 little-endian  n, the number of tokens (ranks 0..n, all present)
    n bytes            the byte length of each token, in rank order (every token is 1..=255)
    the tokens' bytes, concatenated in rank order

The rank of a token is its index, so no rank numbers are stored. tests in bpe.rs check
every token against tiktoken-rs.
"""
import base64
import gzip
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizers")

for path in sys.argv[1:]:
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    pairs = [line.split() for line in raw.splitlines() if line]
    tokens = [base64.b64decode(t) for t, _ in pairs]
    ranks = [int(r) for _, r in pairs]
    if ranks != list(range(len(tokens))):
        sys.exit(f"{path}: ranks are not 0..n in order")
    if not all(1 <= len(t) <= 255 for t in tokens):
        sys.exit(f"{path}: a token is empty or longer than 255 bytes")
    name = os.path.basename(path).split(".")[0]
    with open(os.path.join(OUT, name + ".ranks"), "wb") as f:
        f.write(struct.pack("<I", len(tokens)))
        f.write(bytes(len(t) for t in tokens))
        f.write(b"".join(tokens))
    print(name, len(tokens), "tokens")
