#!/usr/bin/env bash
# Checks deploy/k8s: every manifest against the Kubernetes API schemas (kubernetes-validate, which
# bundles the schemas and works offline; --strict also rejects unknown fields), and the pod
# entrypoint's environment contract for each role. Exits non-zero on any failure.
#
#   scripts/validate-k8s.sh            (needs `kubernetes-validate` on PATH, or
#                                       KUBERNETES_VALIDATE=/path/to/kubernetes-validate)
# .ci/run installs the validator from PyPI into a venv and calls this script.
set -euo pipefail
cd "$(dirname "$0")/.."

VALIDATOR="${KUBERNETES_VALIDATE:-kubernetes-validate}"
# The Kubernetes release whose API schemas the manifests are checked against (they need 1.24
# or later: Indexed Jobs and their pods' hostnames).
K8S_VERSION="${K8S_VERSION:-1.30.0}"

if ! command -v "$VALIDATOR" >/dev/null 2>&1; then
    echo "validate-k8s: '$VALIDATOR' not found; install it with 'pip install kubernetes-validate'" >&2
    exit 2
fi

shopt -s nullglob
manifests=(deploy/k8s/manifests/*.yaml)
if [ "${#manifests[@]}" -eq 0 ]; then
    echo "validate-k8s: no manifests in deploy/k8s/manifests" >&2
    exit 1
fi
echo "validate-k8s: ${#manifests[@]} manifest files against Kubernetes $K8S_VERSION (strict)"
# It only warns about a kind or apiVersion it has no schema for (a typo, say) and exits 0: such
# a warning fails the check too.
REPORT="$(mktemp)"
status=0
"$VALIDATOR" --strict --kubernetes-version "$K8S_VERSION" "${manifests[@]}" >"$REPORT" 2>&1 || status=$?
cat "$REPORT"
if grep -q '^WARN' "$REPORT"; then
    status=1
fi
rm -f "$REPORT"
if [ "$status" -ne 0 ]; then
    echo "validate-k8s: the manifests do not validate" >&2
    exit 1
fi

# Every role gets the job's secret from the same Kubernetes Secret (docs/PS.md, "Admission"):
# a role without it refuses to start, and one with another is refused by the others.
for role in scheduler servers workers; do
    manifest="deploy/k8s/manifests/$role.yaml"
    if ! grep -A4 -- '- name: TESSERA_JOB_SECRET' "$manifest" | grep -q 'name: tessera-job-secret'; then
        echo "validate-k8s: $manifest does not set TESSERA_JOB_SECRET from the Secret tessera-job-secret" >&2
        exit 1
    fi
done

# The entrypoint: ranks, ids, world size and restart count per role, as docs/LAUNCH.md states.
ENTRYPOINT=deploy/k8s/tessera-pod-env.sh
bash -n "$ENTRYPOINT"
STATE="$(mktemp -d)"
trap 'rm -rf "$STATE"' EXIT
contract() { # role index state-dir: prints the contract variables the command sees
    env -i PATH="$PATH" TESSERA_ROLE="$1" TESSERA_POD_INDEX="$2" TESSERA_STATE_DIR="$3" \
        TESSERA_NUM_SERVERS=2 TESSERA_NUM_WORKERS=3 TESSERA_SCHEDULER_ADDR=sched-0.sched:50051 \
        bash "$ENTRYPOINT" sh -c 'echo "$TESSERA_ROLE rank=$TESSERA_RANK world=$TESSERA_WORLD_SIZE local=$TESSERA_LOCAL_RANK sid=${TESSERA_SERVER_ID--} wid=${TESSERA_WORKER_ID--} restart=$TESSERA_RESTART_COUNT"'
}
expect() { # actual expected
    if [ "$1" != "$2" ]; then
        echo "validate-k8s: $ENTRYPOINT gave '$1', expected '$2'" >&2
        exit 1
    fi
}
mkdir "$STATE/s" "$STATE/v" "$STATE/w"
expect "$(contract scheduler 0 "$STATE/s")" "scheduler rank=0 world=6 local=0 sid=- wid=- restart=0"
expect "$(contract server 1 "$STATE/v")" "server rank=2 world=6 local=0 sid=1 wid=- restart=0"
expect "$(contract worker 2 "$STATE/w")" "worker rank=5 world=6 local=0 sid=- wid=2 restart=0"
# MindSpore's names: a worker's rank, count, device and the scheduler's host and port; a server's role.
ms() { # role index state-dir: prints MindSpore's variables the command sees
    env -i PATH="$PATH" TESSERA_ROLE="$1" TESSERA_POD_INDEX="$2" TESSERA_STATE_DIR="$3" \
        TESSERA_NUM_SERVERS=2 TESSERA_NUM_WORKERS=3 TESSERA_SCHEDULER_ADDR=sched-0.sched:50051 \
        bash "$ENTRYPOINT" sh -c 'echo "$MS_ROLE rank=${RANK_ID--} size=${RANK_SIZE--} node=${MS_NODE_ID--} device=${DEVICE_ID--} workers=$MS_WORKER_NUM servers=$MS_SERVER_NUM sched=$MS_SCHED_HOST:$MS_SCHED_PORT"'
}
mkdir "$STATE/ms" "$STATE/mv"
expect "$(ms worker 2 "$STATE/ms")" "MS_WORKER rank=2 size=3 node=2 device=0 workers=3 servers=2 sched=sched-0.sched:50051"
expect "$(ms server 1 "$STATE/mv")" "MS_PSERVER rank=- size=- node=- device=- workers=3 servers=2 sched=sched-0.sched:50051"
# A container restarted in the same pod (same state directory) counts the restart.
expect "$(contract worker 2 "$STATE/w")" "worker rank=5 world=6 local=0 sid=- wid=2 restart=1"
# Without a role (`docker run IMAGE tessera …` outside a pod) the command runs unchanged.
expect "$(env -i PATH="$PATH" bash "$ENTRYPOINT" sh -c 'echo "plain rank=${TESSERA_RANK--}"')" "plain rank=-"
if contract worker 3 "$STATE/w" >/dev/null 2>&1; then
    echo "validate-k8s: $ENTRYPOINT accepted worker index 3 of 3" >&2
    exit 1
fi
# The workers' probe: succeeds while the scheduler's port accepts connections, fails after.
PORT_FILE="$STATE/port"
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
open(sys.argv[1], "w").write(str(s.getsockname()[1])); time.sleep(30)' "$PORT_FILE" &
LISTENER=$!
for _ in $(seq 100); do [ -s "$PORT_FILE" ] && break; sleep 0.1; done
PORT="$(cat "$PORT_FILE")"
probe() { TESSERA_SCHEDULER_ADDR="127.0.0.1:$PORT" bash "$ENTRYPOINT" --probe-scheduler 2>/dev/null; }
if ! probe; then
    kill "$LISTENER"
    echo "validate-k8s: the probe failed while the scheduler port $PORT was open" >&2
    exit 1
fi
kill "$LISTENER"
wait "$LISTENER" 2>/dev/null || true
if probe; then
    echo "validate-k8s: the probe succeeded with nothing listening on $PORT" >&2
    exit 1
fi
echo "validate-k8s: manifests and entrypoint OK"
