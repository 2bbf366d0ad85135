#!/bin/bash
# Sets Tessera's process environment contract (docs/LAUNCH.md; the names and their parsing are
# crates/runtime/src/launch_env.rs) inside a Kubernetes pod, then runs the given command. The
# image's entrypoint; the manifests in manifests/ call it.
#
# Inputs, set by the manifests:
#   TESSERA_ROLE            scheduler | server | worker
#   TESSERA_NUM_SERVERS     servers in the job
#   TESSERA_NUM_WORKERS     workers in the job
#   TESSERA_SCHEDULER_ADDR  host:port of the scheduler (its headless DNS name)
#   TESSERA_POD_INDEX       the Indexed Job's completion index of this pod
#   TESSERA_STATE_DIR       a directory that outlives container restarts in the pod (an
#                           emptyDir volume; default /var/run/tessera)
# Sets: TESSERA_RANK, TESSERA_WORLD_SIZE, TESSERA_LOCAL_RANK (0: one process per pod),
# TESSERA_SERVER_ID or TESSERA_WORKER_ID, and TESSERA_RESTART_COUNT (0 at the pod's first
# start, k after the container's k-th restart in this pod).
#
#   tessera-pod-env COMMAND [ARGS...]    set the contract and exec COMMAND (without
#                                        TESSERA_ROLE: exec COMMAND unchanged)
#   tessera-pod-env --probe-scheduler    exit 0 if the scheduler accepts a TCP connection
set -euo pipefail

fail() {
    echo "tessera-pod-env: $*" >&2
    exit 2
}

is_count() {
    [[ "$1" =~ ^[0-9]+$ ]]
}

if [ "${1-}" = "--probe-scheduler" ]; then
    addr="${TESSERA_SCHEDULER_ADDR:?TESSERA_SCHEDULER_ADDR is not set}"
    host="${addr%:*}"
    port="${addr##*:}"
    # bash's /dev/tcp: connect and close, within 3 seconds.
    exec timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port"
fi

[ "$#" -ge 1 ] || fail "no command given"
# Outside a PS pod (no role given), the command runs as it is: `docker run IMAGE tessera …`.
[ -n "${TESSERA_ROLE-}" ] || exec "$@"
role="$TESSERA_ROLE"
servers="${TESSERA_NUM_SERVERS:?TESSERA_NUM_SERVERS is not set}"
workers="${TESSERA_NUM_WORKERS:?TESSERA_NUM_WORKERS is not set}"
index="${TESSERA_POD_INDEX:?TESSERA_POD_INDEX is not set}"
: "${TESSERA_SCHEDULER_ADDR:?TESSERA_SCHEDULER_ADDR is not set}"
for value in "$servers" "$workers" "$index"; do
    is_count "$value" || fail "expected a count, got '$value'"
done

unset TESSERA_SERVER_ID TESSERA_WORKER_ID
case "$role" in
scheduler)
    [ "$index" = 0 ] || fail "there is one scheduler, got index $index"
    rank=0
    ;;
server)
    [ "$index" -lt "$servers" ] || fail "server index $index is not below $servers"
    export TESSERA_SERVER_ID="$index"
    rank=$((1 + index))
    ;;
worker)
    [ "$index" -lt "$workers" ] || fail "worker index $index is not below $workers"
    export TESSERA_WORKER_ID="$index"
    rank=$((1 + servers + index))
    ;;
*)
    fail "TESSERA_ROLE must be scheduler, server or worker, got '$role'"
    ;;
esac

state="${TESSERA_STATE_DIR:-/var/run/tessera}"
count_file="$state/restart_count"
if [ -f "$count_file" ]; then
    previous="$(cat "$count_file")"
    is_count "$previous" || fail "$count_file holds '$previous', not a count"
    count=$((previous + 1))
else
    count=0
fi
echo "$count" >"$count_file"

export TESSERA_RANK="$rank"
export TESSERA_WORLD_SIZE=$((1 + servers + workers))
export TESSERA_LOCAL_RANK=0
export TESSERA_RESTART_COUNT="$count"

# MindSpore's names for the same facts, for scripts written for msrun and MindSpore's PS roles
# (runtime::launch_env; docs/LAUNCH.md). Each pod is its own host: a worker's device is 0.
unset RANK_ID RANK_SIZE MS_NODE_ID DEVICE_ID MS_SERVER_NUM
case "$role" in
scheduler) export MS_ROLE=MS_SCHED ;;
server) export MS_ROLE=MS_PSERVER ;;
worker)
    export MS_ROLE=MS_WORKER RANK_ID="$index" RANK_SIZE="$workers" MS_NODE_ID="$index" DEVICE_ID=0
    ;;
esac
export MS_WORKER_NUM="$workers"
[ "$servers" = 0 ] || export MS_SERVER_NUM="$servers"
export MS_SCHED_HOST="${TESSERA_SCHEDULER_ADDR%:*}" MS_SCHED_PORT="${TESSERA_SCHEDULER_ADDR##*:}"
exec "$@"
