#!/usr/bin/env python3
"""Writes compaction-proxy's OCI image archive from scratch, with the standard library only.

    scripts/oci-image.py --binary BIN --ca-bundle PEM --out IMAGE.oci.tar [--tag T ...]

The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...) in a tar,
with a Docker-style manifest.json beside it, so that `docker load`, `podman load`,
`skopeo copy oci-archive:...` and `umoci` all take it. Two gzip-compressed layers:

1. the root: deploy/rootfs/ (passwd and group with the user 65532, hosts, nsswitch.conf,
   the default configuration), the CA roots, the state volume /var/lib/compaction-proxy
   owned by 65532, /tmp, the user's home;
2. the binary at /usr/local/bin/compaction-proxy.

Byte-for-byte reproducible: every time stamp is SOURCE_DATE_EPOCH (default 0), owners are
numeric, entries are sorted, gzip carries no name or time. The Dockerfile makes the same
files (the release check compares the two lists when Docker can build).
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
USER = 65532
STATE = "var/lib/compaction-proxy"
BINARY = "usr/local/bin/compaction-proxy"
CONFIG = "/etc/compaction-proxy/proxy.toml"


def entry(name, mtime, mode, uid=0, gid=0, data=None):
    info = tarfile.TarInfo(name)
    info.mtime = mtime
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    if data is None:
        info.type = tarfile.DIRTYPE
    else:
        info.size = len(data)
    return info, data


def layer_tar(entries):
    """An uncompressed tar of the entries, parents first, in name order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in sorted(entries, key=lambda e: e[0].name):
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def parents(path, mtime):
    """Directory entries (root-owned, 0755) for every parent of `path`."""
    parts = path.split("/")[:-1]
    return [entry("/".join(parts[: i + 1]), mtime, 0o755) for i in range(len(parts))]


def gz(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as f:
        f.write(data)
    return buf.getvalue()


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--ca-bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="compaction-proxy")
    ap.add_argument("--tag", action="append", help="tags (default: the crate's version and latest)")
    ap.add_argument("--version", required=True)
    args = ap.parse_args()
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    tags = args.tag or [args.version, "latest"]

    # Layer 1: the root around the binary.
    base = {}

    def add(info_data):
        base[info_data[0].name] = info_data

    rootfs = os.path.join(ROOT, "deploy", "rootfs")
    for dirpath, dirnames, filenames in os.walk(rootfs):
        dirnames.sort()
        for f in sorted(filenames):
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, rootfs)
            for p in parents(rel, mtime):
                add(p)
            with open(full, "rb") as fh:
                add(entry(rel, mtime, 0o644, data=fh.read()))
    certs = "etc/ssl/certs/ca-certificates.crt"
    for p in parents(certs, mtime):
        add(p)
    with open(args.ca_bundle, "rb") as fh:
        add(entry(certs, mtime, 0o644, data=fh.read()))
    for p in parents(STATE + "/x", mtime):
        add(p)
    add(entry(STATE, mtime, 0o700, USER, USER))
    add(entry("home", mtime, 0o755))
    add(entry("home/nonroot", mtime, 0o700, USER, USER))
    add(entry("tmp", mtime, 0o1777))
    layer1 = layer_tar(base.values())

    # Layer 2: the binary.
    with open(args.binary, "rb") as fh:
        binary = fh.read()
    layer2 = layer_tar(parents(BINARY, mtime) + [entry(BINARY, mtime, 0o755, data=binary)])

    layers = [(layer1, gz(layer1), "the root: users, CA roots, configuration, state volume"),
              (layer2, gz(layer2), "the static binary")]
    created = datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc)
    created = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{USER}:{USER}",
            "ExposedPorts": {"8080/tcp": {}},
            "Env": [
                "PATH=/usr/local/bin",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                # A configuration of the user's own without cache.path still puts the
                # embedded store in the volume: $XDG_STATE_HOME/compaction-proxy/.
                "XDG_STATE_HOME=/var/lib",
                # Two glibc malloc arenas instead of up to 8 per core: memory freed after
                # a burst goes back (docs/performance.md, bench/memory.sh).
                "MALLOC_ARENA_MAX=2",
            ],
            "Entrypoint": ["/" + BINARY],
            "Cmd": ["serve", "--config", CONFIG],
            # Flags alone (`docker run IMAGE --upstream URL`) read ./proxy.toml: this one.
            "WorkingDir": os.path.dirname(CONFIG),
            "Volumes": {"/" + STATE: {}},
            "StopSignal": "SIGTERM",
            "Labels": {
                "org.opencontainers.image.title": args.name,
                "org.opencontainers.image.version": args.version,
                "org.opencontainers.image.description":
                    "A transparent OpenAI-compatible proxy that compacts over-long chat conversations",
                "org.opencontainers.image.licenses": "MIT OR Apache-2.0",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [sha(raw) for raw, _, _ in layers]},
        "history": [{"created": created, "created_by": f"scripts/oci-image.py: {what}"}
                    for _, _, what in layers],
    }
    config_blob = json.dumps(config, indent=2, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": sha(z), "size": len(z)} for _, z, _ in layers],
        "annotations": {"org.opencontainers.image.version": args.version,
                        "org.opencontainers.image.created": created},
    }
    manifest_blob = json.dumps(manifest, indent=2, sort_keys=True).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": manifest["mediaType"],
            "digest": sha(manifest_blob),
            "size": len(manifest_blob),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"org.opencontainers.image.ref.name": tag,
                            "io.containerd.image.name": f"docker.io/library/{args.name}:{tag}"},
        } for tag in tags],
    }

    def blob(data):
        return "blobs/sha256/" + hashlib.sha256(data).hexdigest()

    # Docker's own archive format beside the OCI layout: older `docker load` reads only this.
    docker_manifest = [{"Config": blob(config_blob),
                        "RepoTags": [f"{args.name}:{t}" for t in tags],
                        "Layers": [blob(z) for _, z, _ in layers]}]
    files = [("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
             ("index.json", json.dumps(index, indent=2).encode()),
             ("manifest.json", json.dumps(docker_manifest, indent=2).encode()),
             (blob(config_blob), config_blob),
             (blob(manifest_blob), manifest_blob)]
    files += [(blob(z), z) for _, z, _ in layers]
    entries = [entry("blobs", mtime, 0o755), entry("blobs/sha256", mtime, 0o755)]
    entries += [entry(name, mtime, 0o644, data=data) for name, data in files]
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as out:
        out.write(layer_tar(entries))
    os.replace(tmp, args.out)
    print(f"{args.out}: {os.path.getsize(args.out)} bytes, manifest {sha(manifest_blob)}, "
          f"tags {', '.join(tags)}", file=sys.stderr)


if __name__ == "__main__":
    main()
