#!/usr/bin/env bash
# Runs the seed parameter-server job of manifests/ as containers of the image, without a cluster:
# a scheduler, S servers and N workers on one Docker network whose DNS names are the pods' names
# (tessera-scheduler-0.tessera-scheduler, tessera-server-<i>.tessera-server), each with the
# environment its manifest sets and the image's entrypoint (tessera-pod-env). Passes when every
# worker exits 0. Removes only the containers and the network it created.
#
#   deploy/k8s/test-in-docker.sh [IMAGE]          (default tessera:dev; build it first:
#                                                   docker build -f deploy/k8s/Dockerfile -t tessera:dev .)
# Environment: DOCKER (the docker command, default docker), SERVERS (2), WORKERS (2),
# CONFIG (examples/seed_parameter_server.toml; its [ps] counts must match), TIMEOUT (600 s).
set -euo pipefail
image="${1:-tessera:dev}"
docker="${DOCKER:-docker}"
servers="${SERVERS:-2}"
workers="${WORKERS:-2}"
config="${CONFIG:-examples/seed_parameter_server.toml}"
timeout_s="${TIMEOUT:-600}"
tag="tessera-ps-test-$$"
scheduler_addr="tessera-scheduler-0.tessera-scheduler:50051"
created=()

cleanup() {
    for c in "${created[@]}"; do
        "$docker" rm -f "$c" >/dev/null 2>&1 || true
    done
    "$docker" network rm "$tag" >/dev/null 2>&1 || true
}
trap cleanup EXIT

"$docker" image inspect "$image" >/dev/null
# The job's secret, as the Secret tessera-job-secret hands it to every pod.
job_secret="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"
"$docker" network create "$tag" >/dev/null

# start NAME ALIAS ROLE INDEX [ENV...]: one pod's container, as its manifest describes it.
start() {
    local name="$1" alias="$2" role="$3" index="$4"
    shift 4
    local env=(-e "TESSERA_ROLE=$role" -e "TESSERA_NUM_SERVERS=$servers"
        -e "TESSERA_NUM_WORKERS=$workers" -e "TESSERA_SCHEDULER_ADDR=$scheduler_addr"
        -e "TESSERA_POD_INDEX=$index" -e "TESSERA_JOB_SECRET=$job_secret")
    for kv in "$@"; do env+=(-e "$kv"); done
    local alias_flag=()
    [ -n "$alias" ] && alias_flag=(--network-alias "$alias")
    "$docker" run -d --name "$tag-$name" --network "$tag" "${alias_flag[@]}" "${env[@]}" \
        "$image" tessera train "$config" >/dev/null
    created+=("$tag-$name")
}

start scheduler tessera-scheduler-0.tessera-scheduler scheduler 0 TESSERA_HOST=0.0.0.0
for i in $(seq 0 $((servers - 1))); do
    start "server-$i" "tessera-server-$i.tessera-server" server "$i" TESSERA_HOST=0.0.0.0 \
        TESSERA_SERVER_PORT=50052 "TESSERA_ADVERTISE_HOST=tessera-server-$i.tessera-server"
done
for i in $(seq 0 $((workers - 1))); do
    start "worker-$i" "" worker "$i"
done

status=0
for i in $(seq 0 $((workers - 1))); do
    c="$tag-worker-$i"
    code="$(timeout "$timeout_s" "$docker" wait "$c" || echo timeout)"
    if [ "$code" != 0 ]; then
        echo "worker $i: exit $code; its log:" >&2
        "$docker" logs "$c" 2>&1 | tail -30 >&2
        status=1
    fi
done
if [ "$status" = 0 ]; then
    echo "every worker exited 0; worker 0's last lines:"
    "$docker" logs "$tag-worker-0" 2>&1 | tail -5
else
    for c in "${created[@]}"; do
        echo "--- $c" >&2
        "$docker" logs "$c" 2>&1 | tail -10 >&2
    done
fi
exit "$status"
