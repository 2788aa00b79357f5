# The image scripts/release.sh writes (scripts/oci-image.py), for those who build with
# Docker: the same static binary (same profile, same flags), the same files, the same
# user, ports, volume, entrypoint and command. tests/suite/deploy_examples.rs keeps the two in
# step. `docker build -t compaction-proxy:0.1.0 .` (docs/deploy.md)

# Builder: Debian bookworm's glibc, linked statically (its libc6-dev carries libc.a).
FROM rust:1.95-bookworm AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN RUSTFLAGS="-C target-feature=+crt-static" CARGO_PROFILE_SHIP_STRIP=symbols \
    cargo build --locked --profile ship --target x86_64-unknown-linux-gnu --bin compaction-proxy \
 && cp target/x86_64-unknown-linux-gnu/ship/compaction-proxy /compaction-proxy \
 && mkdir -m 0700 /state /home-nonroot \
 && mkdir -m 1777 /tmp-dir

# The image: from scratch, nothing but what the proxy needs.
FROM scratch
COPY deploy/rootfs/ /
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder --chown=65532:65532 /state /var/lib/compaction-proxy
COPY --from=builder --chown=65532:65532 /home-nonroot /home/nonroot
COPY --from=builder /tmp-dir /tmp
COPY --from=builder /compaction-proxy /usr/local/bin/compaction-proxy
ENV PATH=/usr/local/bin
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
ENV XDG_STATE_HOME=/var/lib
# Two glibc malloc arenas instead of up to 8 per core: memory freed after a burst goes
# back instead of staying spread over arenas (docs/performance.md, bench/memory.sh).
ENV MALLOC_ARENA_MAX=2
USER 65532:65532
EXPOSE 8080
VOLUME ["/var/lib/compaction-proxy"]
WORKDIR /etc/compaction-proxy
ENTRYPOINT ["/usr/local/bin/compaction-proxy"]
CMD ["serve", "--config", "/etc/compaction-proxy/proxy.toml"]
