#!/usr/bin/env bash
# Runs a job of the manifests as containers of the image, without a cluster, on one Docker
# network whose DNS names are the pods' names. Removes only the containers and the network it
# created.
#
# Parameter-server job (default; manifests/): a scheduler, S servers and N workers
# (tessera-scheduler-0.tessera-scheduler, tessera-server-<i>.tessera-server), each with the
# environment its manifest sets and the image's entrypoint (tessera-pod-env). Passes when every
# worker exits 0.
#
# Collective job (--collective; collective/indexed-job.yaml): NODES containers named like the
# Indexed Job's pods (host name tessera-collective-<i>, DNS name
# tessera-collective-<i>.tessera-collective), each running the Job's command with its node rank:
#   tessera launch --worker_num NODES --local_worker_num 1 \
#       --master_addr tessera-collective-0.tessera-collective --master_port 8118 \
#       --node_rank <i> -- tessera train CONFIG --devices NODES …
# Passes when every node exits 0; then lists node 0's log directory.
#
#   deploy/k8s/test-in-docker.sh [--collective] [IMAGE]
#                                   (default tessera:dev; build it first:
#                                    docker build -f deploy/k8s/Dockerfile -t tessera:dev .)
# Environment: DOCKER (the docker command, default docker), TIMEOUT (600 s); for the PS job
# SERVERS (2), WORKERS (2), CONFIG (examples/seed_parameter_server.toml; its [ps] counts must
# match); for the collective job NODES (4), CONFIG (examples/seed_data_parallel.toml).
set -euo pipefail
mode=ps
if [ "${1-}" = "--collective" ]; then
    mode=collective
    shift
fi
image="${1:-tessera:dev}"
docker="${DOCKER:-docker}"
servers="${SERVERS:-2}"
workers="${WORKERS:-2}"
nodes="${NODES:-4}"
if [ "$mode" = collective ]; then
    config="${CONFIG:-examples/seed_data_parallel.toml}"
else
    config="${CONFIG:-examples/seed_parameter_server.toml}"
fi
timeout_s="${TIMEOUT:-600}"
tag="tessera-$mode-test-$$"
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

if [ "$mode" = collective ]; then
    [[ "$nodes" =~ ^[1-9][0-9]*$ ]] || {
        echo "test-in-docker: NODES must be a positive count, got '$nodes'" >&2
        exit 2
    }
    "$docker" network create "$tag" >/dev/null
    service=tessera-collective
    master="$service-0.$service"
    # One container per pod of collective/indexed-job.yaml, with its command and node rank.
    for i in $(seq 0 $((nodes - 1))); do
        "$docker" run -d --name "$tag-node-$i" --network "$tag" \
            --hostname "$service-$i" --network-alias "$service-$i.$service" \
            "$image" tessera launch --worker_num "$nodes" --local_worker_num 1 \
            --master_addr "$master" --master_port 8118 --node_rank "$i" \
            -- tessera train "/opt/tessera/$config" --devices "$nodes" \
            --set 'data.dir="/opt/tessera/data/digits"' \
            --set 'output.dir="/opt/tessera/runs/seed_collective"' \
            --set output.save_checkpoint=false >/dev/null
        created+=("$tag-node-$i")
    done
    status=0
    deadline=$((SECONDS + timeout_s))
    for i in $(seq 0 $((nodes - 1))); do
        c="$tag-node-$i"
        left=$((deadline - SECONDS))
        code="$(timeout "$((left > 0 ? left : 1))" "$docker" wait "$c" || echo timeout)"
        if [ "$code" != 0 ]; then
            echo "node $i: exit $code; its log:" >&2
            "$docker" logs "$c" 2>&1 | tail -30 >&2
            status=1
        fi
    done
    if [ "$status" = 0 ]; then
        echo "every node exited 0; node 0's last lines:"
        "$docker" logs "$tag-node-0" 2>&1 | tail -5
        echo "node 0's log directory (/opt/tessera/tessera_logs):"
        "$docker" cp "$tag-node-0:/opt/tessera/tessera_logs" - | tar -t
    fi
    exit "$status"
fi
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
