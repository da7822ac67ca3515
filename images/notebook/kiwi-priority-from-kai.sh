#!/bin/sh
# s6 container init step: derive KIWI_PRIORITY from the pod's KAI priority class.
#
# The notebook pod template passes its `priorityClassName` label in KIWI_KAI_PRIORITY_CLASS
# (the downward API cannot read spec.priorityClassName). KAI's preemptible classes (train,
# build-preemptible, any value under 100) become LOW; build becomes NORMAL; inference HIGH.
# An explicit KIWI_PRIORITY always wins. s6 hands the files in its container environment
# directory to the services it starts, JupyterLab included. This step never fails the container:
# at worst the notebook keeps the default priority.
set -u
env_dir=${KIWI_S6_ENV_DIR:-/run/s6/container_environment}
if [ -n "${KIWI_PRIORITY:-}" ] || [ -z "${KIWI_KAI_PRIORITY_CLASS:-}" ]; then
    exit 0
fi
if priority=$(python3 -m nodeside.kai priority "$KIWI_KAI_PRIORITY_CLASS"); then
    if printf '%s' "$priority" > "$env_dir/KIWI_PRIORITY"; then
        echo "kiwi: KAI priority class $KIWI_KAI_PRIORITY_CLASS -> KIWI_PRIORITY=$priority"
    else
        echo "kiwi: cannot write $env_dir/KIWI_PRIORITY; keeping the default priority" >&2
    fi
else
    echo "kiwi: keeping the default priority" >&2
fi
exit 0
