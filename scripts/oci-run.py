#!/usr/bin/env python3
"""Runs an image from an OCI archive the way a container runtime would, without one.

    scripts/oci-run.py ARCHIVE --tag TAG --rootfs DIR [--print-config] [-- ARG...]

Reads the archive's index.json, takes the manifest tagged TAG, checks every blob against
its digest, untars the layers in order into DIR (whiteouts honoured), then executes the
image's Entrypoint + Cmd (or Entrypoint + ARGs, as `docker run IMAGE ARG...` replaces Cmd)
chrooted into DIR, in its WorkingDir, as its User, with only its Env. No namespaces: the
process shares the host's network, so an upstream on 127.0.0.1 is reachable. Needs root.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile


def blob(layout, digest, media_type=None):
    algo, hexdigest = digest.split(":", 1)
    with layout.extractfile(f"blobs/{algo}/{hexdigest}") as f:
        data = f.read()
    if hashlib.new(algo, data).hexdigest() != hexdigest:
        sys.exit(f"oci-run: blob {digest} does not match its digest")
    return data


def unpack_layer(data, media_type, rootfs):
    if media_type.endswith("+gzip"):
        data = gzip.decompress(data)
    elif not media_type.endswith(".tar"):
        sys.exit(f"oci-run: layer type {media_type} not supported")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = []
        for m in tar.getmembers():
            name = os.path.normpath(m.name).lstrip("/")
            if name.startswith(".."):
                sys.exit(f"oci-run: layer entry {m.name} escapes the root")
            head, base = os.path.split(name)
            if base == ".wh..wh..opq":  # opaque directory: drop what lower layers put there
                target = os.path.join(rootfs, head)
                for child in os.listdir(target) if os.path.isdir(target) else []:
                    remove(os.path.join(target, child))
                continue
            if base.startswith(".wh."):  # whiteout: delete the file of a lower layer
                remove(os.path.join(rootfs, head, base[4:]))
                continue
            members.append(m)
        kwargs = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        tar.extractall(rootfs, members=members, numeric_owner=True, **kwargs)


def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        for child in os.listdir(path):
            remove(os.path.join(path, child))
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--print-config", action="store_true",
                    help="print the image's config and exit after unpacking")
    argv = sys.argv[1:]
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []
    opts = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    with tarfile.open(opts.archive) as layout:
        index = json.loads(layout.extractfile("index.json").read())
        refs = [m for m in index["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == opts.tag]
        if not refs:
            sys.exit(f"oci-run: no manifest tagged {opts.tag} in {opts.archive}")
        manifest = json.loads(blob(layout, refs[0]["digest"]))
        config = json.loads(blob(layout, manifest["config"]["digest"]))
        os.makedirs(opts.rootfs, exist_ok=True)
        for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"]):
            data = blob(layout, layer["digest"])
            raw = gzip.decompress(data) if layer["mediaType"].endswith("+gzip") else data
            if "sha256:" + hashlib.sha256(raw).hexdigest() != diff_id:
                sys.exit(f"oci-run: layer {layer['digest']} does not match diff_id {diff_id}")
            unpack_layer(data, layer["mediaType"], opts.rootfs)

    c = config["config"]
    if opts.print_config:
        json.dump(c, sys.stdout, indent=2)
        print()
        return
    argv = c.get("Entrypoint", []) + (cmd or c.get("Cmd", []))
    env = dict(e.split("=", 1) for e in c.get("Env", []))
    user, _, group = c.get("User", "0").partition(":")
    uid, gid = int(user), int(group or user)
    if "HOME" not in env:  # as Docker does: the user's home from the image's passwd
        env["HOME"] = "/"
        try:
            with open(os.path.join(opts.rootfs, "etc/passwd")) as f:
                for line in f:
                    fields = line.strip().split(":")
                    if len(fields) > 5 and fields[2] == str(uid):
                        env["HOME"] = fields[5]
        except OSError:
            pass
    os.chroot(opts.rootfs)
    os.chdir(c.get("WorkingDir") or "/")
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main()
