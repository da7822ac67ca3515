#!/usr/bin/env bash
# `make images`: the node and notebook images, built with buildah from nodeside/Dockerfile and
# images/notebook/Dockerfile as shipped, from the wheel this checkout builds.
#
# Each Dockerfile names its bases in build arguments whose defaults are upstream images. Where
# one cannot be pulled (a machine that reaches no container registry, as CI's), a stand-in built
# from Debian's packages takes its place (images/stand-in/), passed in the same argument.
#
# Environment (make passes PYTHON):
#   PYTHON        the Python whose tools build the wheel: .venv/bin/python, which has built the
#                 panel and the scheduler core in place already
#   KIWI_WHEEL    a wheel to install instead (a path under the repository root); "source": the
#                 images build one from the sources, with node and a compiler in a build stage
#   IMAGES_BASES  auto (upstream where it can be pulled, else a stand-in), upstream or stand-in
#   IMAGE_PREFIX  the images' names before kiwi-node and kiwi-notebook (default localhost/)
#   IMAGE_TAG     their tag (default: the package's version)
#
# `images/build.sh --remove-containers` removes the buildah working containers of these images
# (and of the stand-ins) that anything left behind: a smoke test's, a build that failed. `make
# images` runs it after its tests, whatever they said.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
IMAGES_BASES=${IMAGES_BASES:-auto}
IMAGE_PREFIX=${IMAGE_PREFIX:-localhost/}
IMAGE_TAG=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)}
STAND_IN=localhost/kiwi-stand-in
DEBIAN_SUITE=bookworm  # the upstream bases' release

command -v buildah > /dev/null || {
    echo "images: needs buildah (and mmdebstrap where a base must be stood in for):" \
         "apt-get install buildah mmdebstrap" >&2
    exit 1
}

# The working containers of the images made here: kiwi-node, kiwi-notebook, the stand-ins (by
# image ID: a container names only one of its image's tags).
remove_containers() {
    local ours left
    ours=$(buildah images --format '{{.ID}} {{.Name}}:{{.Tag}}' |
        awk -v prefix="$IMAGE_PREFIX" -v stand_in="$STAND_IN/" \
            'index($2, prefix "kiwi-node:") == 1 || index($2, prefix "kiwi-notebook:") == 1 ||
             index($2, stand_in) == 1 { print $1 }' | sort -u)
    [ -z "$ours" ] && return 0
    left=$(buildah containers --format '{{.ContainerID}} {{.ImageID}}' |
        awk -v ours="$ours" 'BEGIN { n = split(ours, id, "\n") }
             { for (i = 1; i <= n; i++) if (index($2, id[i]) == 1) { print $1; next } }')
    [ -z "$left" ] && return 0
    echo "images: removing $(echo "$left" | wc -w) working container(s) left behind" >&2
    # shellcheck disable=SC2086 # one id a word
    buildah rm $left > /dev/null
}
if [ "${1:-}" = "--remove-containers" ]; then
    remove_containers
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say() { printf 'images: [%4ds] %s\n' "$SECONDS" "$*"; }

# Builds trust what the host trusts: where TLS goes through a proxy with its own authority (as on
# CI's machines), pip and npm inside a build need the host's bundle. Mounted for the build's
# RUN steps only; no layer keeps it.
build_volumes=()
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$work/pip.conf"
    printf 'cafile=/etc/ssl/certs/ca-certificates.crt\n' > "$work/npmrc"
    build_volumes=(-v /etc/ssl/certs:/etc/ssl/certs:ro -v "$work/pip.conf:/etc/pip.conf:ro"
                   -v "$work/npmrc:/usr/local/etc/npmrc:ro")
fi

# chroot isolation on the host's network: in VMs like CI's an OCI runtime may not set up its
# limits and namespaces (`podman run` fails at setrlimit), while a chroot works. --layers keeps
# each step's layer, so that a second build reuses every step whose inputs did not change.
# Docker's image format, as Docker builds: OCI's has no SHELL, and the RUN steps' pipes need it.
bud() {
    nice buildah bud --isolation chroot --network host --layers --force-rm --format docker --quiet \
        "${build_volumes[@]}" "$@"
}

arg_default() {  # arg_default DOCKERFILE NAME: the default of ARG NAME in DOCKERFILE
    sed -n "s/^ARG $2=//p" "$1" | head -n 1
}

qualified() {  # docker.io's short names spelt out, as buildah wants them
    local name=$1 first=${1%%/*}
    if [[ $name != */* ]]; then
        name=docker.io/library/$name
    elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
        name=docker.io/$name
    fi
    echo "$name"
}

have_image() { buildah inspect --type image "$1" > /dev/null 2>&1; }

upstream() {  # upstream NAME: true once the image is here, pulled if need be
    have_image "$1" && return 0
    [ "$IMAGES_BASES" = stand-in ] && return 1
    say "pulling $1"
    if timeout 600 buildah pull --quiet "$1" > /dev/null 2> "$work/pull.log"; then
        return 0
    fi
    say "cannot pull $1: $(tail -n 1 "$work/pull.log")"
    [ "$IMAGES_BASES" = upstream ] && exit 1
    say "a stand-in takes its place"
    return 1
}

# Debian's Python 3 with venv and pip, `python` on PATH: what the Dockerfiles ask of
# python:3.11-slim. Without documentation, manual pages and translations, as slim images are.
PYTHON_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
stand_in_python() {
    # Named after what it holds, so that a change here builds a new one.
    local image
    image=$STAND_IN/python:3.11-$DEBIAN_SUITE-$(echo "$PYTHON_PACKAGES" | sha256sum | cut -c1-8)
    have_image "$image" && { echo "$image"; return; }
    command -v mmdebstrap > /dev/null || {
        echo "images: needs mmdebstrap to build $image: apt-get install mmdebstrap" >&2
        exit 1
    }
    say "building $image (mmdebstrap)" >&2
    nice mmdebstrap --quiet --variant=minbase --dpkgopt=force-unsafe-io \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --include="$PYTHON_PACKAGES" \
        "$DEBIAN_SUITE" "$work/rootfs.tar" \
        "deb http://deb.debian.org/debian $DEBIAN_SUITE main" \
        "deb http://deb.debian.org/debian $DEBIAN_SUITE-updates main" \
        "deb http://deb.debian.org/debian-security $DEBIAN_SUITE-security main" >&2
    local container
    container=$(buildah from scratch)
    # Removed if anything below fails (set -e); the commit removes it otherwise. (This runs in
    # a command substitution's subshell: its EXIT trap is its own, the script's is untouched.)
    trap 'buildah rm "$container" > /dev/null 2>&1' EXIT
    buildah add --quiet "$container" "$work/rootfs.tar" / > /dev/null
    rm -f "$work/rootfs.tar"
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd python3 "$container"
    buildah commit --quiet --rm "$container" "$image" > /dev/null
    trap - EXIT
    echo "$image"
}

# Node at /usr/local, as the node image lays it out: the host's own Node and npm (the project's
# build needs them already) on the Python stand-in. Only a build from the sources uses it.
stand_in_node() {
    local image=$STAND_IN/node:$(node --version | sed 's/^v//')-$DEBIAN_SUITE
    say "building $image from this machine's $(command -v node)" >&2
    mkdir -p "$work/node/bin" "$work/node/lib/node_modules"
    cp "$(command -v node)" "$work/node/bin/node"
    cp -r "$(npm root -g)/npm" "$work/node/lib/node_modules/npm"
    bud -f images/stand-in/node/Dockerfile --build-arg "PYTHON_IMAGE=$1" -t "$image" \
        "$work/node" > /dev/null
    echo "$image"
}

# Kubeflow's notebook base as far as images/notebook/Dockerfile and its smoke test need it.
# Built every time: --layers reuses every step whose inputs did not change.
stand_in_notebook_base() {
    local image=$STAND_IN/jupyter:kubeflow-1.9
    say "building $image" >&2
    bud -f images/stand-in/notebook/Dockerfile --build-arg "PYTHON_IMAGE=$1" -t "$image" \
        images/stand-in/notebook > /dev/null
    echo "$image"
}

# The wheel: built once, here, and installed by both images.
if [ -z "${KIWI_WHEEL+set}" ]; then
    say "building the wheel"
    rm -f dist/kiwi_jupyter-*.whl
    nice "$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w dist . > /dev/null
    KIWI_WHEEL=$(ls dist/kiwi_jupyter-*.whl)
    say "built $KIWI_WHEEL"
elif [ "$KIWI_WHEEL" = source ]; then
    KIWI_WHEEL=""
fi
# A build from the sources compiles the scheduler core against Python's headers, which
# python:3.11-slim has; Debian keeps them apart.
[ -n "$KIWI_WHEEL" ] || PYTHON_PACKAGES+=,libpython3.11-dev

node_file=nodeside/Dockerfile
notebook_file=images/notebook/Dockerfile
python_image=$(qualified "$(arg_default "$node_file" PYTHON_IMAGE)")
node_image=$(qualified "$(arg_default "$node_file" NODE_IMAGE)")
notebook_base=$(qualified "$(arg_default "$notebook_file" BASE_IMAGE)")
[ "$(arg_default "$notebook_file" PYTHON_IMAGE)" = "$(arg_default "$node_file" PYTHON_IMAGE)" ] || {
    echo "images: the two Dockerfiles name different Python bases" >&2
    exit 1
}

upstream "$python_image" || python_image=$(stand_in_python)
bases=(--build-arg "PYTHON_IMAGE=$python_image")
if [ -z "$KIWI_WHEEL" ]; then
    upstream "$node_image" || node_image=$(stand_in_node "$python_image")
    bases+=(--build-arg "NODE_IMAGE=$node_image")
fi

node_tag=${IMAGE_PREFIX}kiwi-node:$IMAGE_TAG
notebook_tag=${IMAGE_PREFIX}kiwi-notebook:$IMAGE_TAG
wheel_arg=(--build-arg "KIWI_WHEEL=$KIWI_WHEEL")
# The node image and the notebook's base side by side: both spend most of their time on
# downloads and on writing layers, not on the two cores.
say "building $node_tag on $python_image"
bud -f "$node_file" "${bases[@]}" "${wheel_arg[@]}" -t "$node_tag" . > "$work/node.log" 2>&1 &
node_build=$!
upstream "$notebook_base" || notebook_base=$(stand_in_notebook_base "$python_image")
say "building $notebook_tag on $notebook_base"
bud -f "$notebook_file" "${bases[@]}" "${wheel_arg[@]}" --build-arg "BASE_IMAGE=$notebook_base" \
    -t "$notebook_tag" . > /dev/null
wait "$node_build" || { cat "$work/node.log" >&2; echo "images: $node_tag failed" >&2; exit 1; }
say "done"
for image in "$node_tag" "$notebook_tag" "$python_image" "$notebook_base"; do
    say "$(buildah images --format '{{.Name}}:{{.Tag}}  {{.Size}}' "$image" | head -n 1)"
done
