#!/usr/bin/env bash
# Makes stand-ins for the Dockerfile's two base images where Docker Hub cannot be reached (an
# air-gapped build host with a Debian mirror): debian:bookworm-slim from `debootstrap --variant=
# minbase bookworm`, and rust:1.95-slim-bookworm from the same with gcc, libc6-dev and
# ca-certificates plus this machine's Rust 1.95 toolchain at the official image's paths
# (RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=/usr/local/cargo). Extra CA certificates in
# /usr/local/share/ca-certificates (a TLS-inspecting proxy's) are trusted inside, so cargo can
# fetch crates. Needs root, debootstrap and a running Docker daemon. Writes only under a fresh
# temporary directory, which it removes, and the two image tags.
#
#   deploy/k8s/offline-base-images.sh [MIRROR]      (default http://deb.debian.org/debian)
# Environment: DOCKER (default docker), TOOLCHAIN (default: the toolchain `rustc +1.95.0`
# runs from, found with `rustc --print sysroot`).
set -euo pipefail
mirror="${1:-http://deb.debian.org/debian}"
docker="${DOCKER:-docker}"
toolchain="${TOOLCHAIN:-$(rustc +1.95.0 --print sysroot)}"
"$toolchain/bin/rustc" --version | grep -q '^rustc 1\.95\.' || {
    echo "offline-base-images: $toolchain is not a Rust 1.95 toolchain" >&2
    exit 2
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

debootstrap --variant=minbase bookworm "$work/slim" "$mirror" >"$work/slim.log"
tar -C "$work/slim" -c . | "$docker" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - debian:bookworm-slim

debootstrap --variant=minbase --include=gcc,libc6-dev,ca-certificates bookworm "$work/rust" \
    "$mirror" >"$work/rust.log"
dest="$work/rust/usr/local/rustup/toolchains/1.95.0-x86_64-unknown-linux-gnu"
mkdir -p "$dest" "$work/rust/usr/local/cargo/bin"
cp -a "$toolchain/bin" "$toolchain/lib" "$toolchain/libexec" "$toolchain/etc" "$dest/"
for b in cargo rustc rustdoc; do
    ln -s "/usr/local/rustup/toolchains/1.95.0-x86_64-unknown-linux-gnu/bin/$b" \
        "$work/rust/usr/local/cargo/bin/$b"
done
shopt -s nullglob
extra=(/usr/local/share/ca-certificates/*.crt)
if [ "${#extra[@]}" -gt 0 ]; then
    cp "${extra[@]}" "$work/rust/usr/local/share/ca-certificates/"
    chroot "$work/rust" update-ca-certificates >/dev/null
fi
tar -C "$work/rust" -c . | "$docker" import \
    --change 'ENV RUSTUP_HOME=/usr/local/rustup' --change 'ENV CARGO_HOME=/usr/local/cargo' \
    --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - rust:1.95-slim-bookworm
echo "offline-base-images: debian:bookworm-slim and rust:1.95-slim-bookworm are ready"
