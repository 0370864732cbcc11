#!/usr/bin/env bash
# Build the Konduit image where no image registry answers (this project's CI), with podman:
#
#   deploy/container/build-local.sh              # the base image, then the image on it
#   deploy/container/build-local.sh base         # the base image alone (.ci/run starts it early)
#   deploy/container/build-local.sh run ARGS...  # run `konduit ARGS...` from the built image
#
# The base is a Debian bookworm root filesystem bootstrapped from Debian's packages (mmdebstrap:
# python3 3.11 with venv and pip) and imported into podman; the Dockerfile at the checkout's root
# is built on it with BASE pointing there (`--isolation chroot`: no container runtime needed).
# `run` mounts the image and runs its entrypoint in a chroot as the image's user, with its
# environment and working directory: what `podman run` would do where it can (it cannot here:
# the sandbox refuses setrlimit). Root only (mmdebstrap, podman image mount).
#
# Where a registry answers, none of this is needed: `docker build -t konduit .` uses the
# official python:3.11-slim.
#
# Environment: KONDUIT_IMAGE (default localhost/konduit:local), KONDUIT_BASE_IMAGE (default
# localhost/konduit-base:bookworm, built when missing), DEBIAN_MIRROR, EXTRAS (the Dockerfile's).
set -euo pipefail
cd "$(dirname "$0")/../.."

image="${KONDUIT_IMAGE:-localhost/konduit:local}"
base="${KONDUIT_BASE_IMAGE:-localhost/konduit-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

inspect() { podman image inspect --format "$1" "$image"; }

if [ "${1:-}" = run ]; then
    shift
    root="$(podman image mount "$image")"
    trap 'podman image unmount "$image" >/dev/null' EXIT
    user="$(inspect '{{.Config.User}}')"
    workdir="$(inspect '{{.Config.WorkingDir}}')"
    mapfile -t environment < <(inspect '{{range .Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
    mapfile -t entrypoint < <(inspect '{{range .Config.Entrypoint}}{{println .}}{{end}}' | sed '/^$/d')
    # chroot does not read the image's PATH: the entrypoint's program is found in it here.
    program="${entrypoint[0]}"
    if [[ "$program" != /* ]]; then
        path="$(printf '%s\n' "${environment[@]}" | sed -n 's/^PATH=//p')"
        for dir in ${path//:/ }; do
            if [ -x "$root$dir/$program" ]; then program="$dir/$program"; break; fi
        done
    fi
    exec chroot --userspec="${user:-0:0}" "$root" /usr/bin/env -i "${environment[@]}" \
        /bin/sh -c 'cd "$0" && exec "$@"' "${workdir:-/}" "$program" "${entrypoint[@]:1}" "$@"
fi

if ! podman image exists "$base"; then
    echo "== the base image $base: Debian bookworm with Python 3.11 (mmdebstrap, $mirror)"
    # --variant=essential: Debian's essential packages (a shell, coreutils, dpkg), no apt;
    # python3-venv brings ensurepip's pip, passwd the Dockerfile's useradd, ca-certificates
    # pip's TLS; no documentation, manual pages or translations (a base for CI, not one to
    # publish). The host's own extra CA certificates (/usr/local/share/ca-certificates), if
    # any, go in too, and pip is told to use the system's bundle: behind a TLS-inspecting proxy pip in the build then trusts what
    # the host's pip trusts. They stay in this local base only, not in the Dockerfile.
    mmdebstrap --quiet --variant=essential --include=python3,python3-venv,passwd,ca-certificates \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='for c in /usr/local/share/ca-certificates/*.crt; do
                              [ -f "$c" ] && cp "$c" "$1/usr/local/share/ca-certificates/"; done
                          chroot "$1" update-ca-certificates >/dev/null 2>&1' \
        bookworm - "$mirror" \
        | podman import --quiet --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
            - "$base" >/dev/null
    echo "   ($SECONDS s)"
fi
if [ "${1:-}" = base ]; then
    exit 0
fi

started=$SECONDS
echo "== the image $image on $base"
# --format docker: an OCI image has no HEALTHCHECK (podman would drop it, with a warning).
# --layers=false: no intermediate images kept (the build stage's included), nothing cached.
podman build --quiet --isolation chroot --format docker --layers=false --build-arg BASE="$base" \
    ${EXTRAS:+--build-arg EXTRAS="$EXTRAS"} --tag "$image" --file Dockerfile . >/dev/null
podman image inspect --format 'built {{.Id}}: {{.Size}} bytes; user {{.Config.User}}, entrypoint {{.Config.Entrypoint}}, health check {{.HealthCheck.Test}}' "$image" \
    || podman images "$image"
echo "   ($((SECONDS - started)) s)"
