#!/bin/bash
# The start of Kubeflow's notebook images without s6-overlay, which Debian does not package: the
# container init steps in /etc/cont-init.d in order, with the environment files they leave in
# s6's container environment directory, then JupyterLab as Kubeflow's jupyterlab service starts
# it. JUPYTER_PORT (default Kubeflow's 8888) lets a smoke test on a shared machine pick a port.
set -euo pipefail
env_dir=/run/s6/container_environment
mkdir -p "$env_dir"
for step in /etc/cont-init.d/*; do
    if [ -x "$step" ]; then
        "$step"
    fi
done
for file in "$env_dir"/*; do
    if [ -f "$file" ]; then
        export "$(basename "$file")=$(cat "$file")"
    fi
done
export JUPYTER_RUNTIME_DIR=/tmp/jupyter_runtime
cd "$HOME"
exec jupyter lab \
    --notebook-dir="$HOME" \
    --ip=0.0.0.0 \
    --no-browser \
    --allow-root \
    --port="${JUPYTER_PORT:-8888}" \
    --ServerApp.token="" \
    --ServerApp.password="" \
    --ServerApp.allow_origin="*" \
    --ServerApp.allow_remote_access=True \
    --ServerApp.authenticate_prometheus=False \
    --ServerApp.base_url="$NB_PREFIX"
