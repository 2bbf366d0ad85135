#!/usr/bin/env bash
# Checks deploy/k8s: every manifest against the Kubernetes API schemas (kubernetes-validate, which
# bundles the schemas and works offline; --strict also rejects unknown fields), the MPIJob of the
# collective jobs against the MPI Operator's vendored CRD (scripts/validate-crd.py) and its pod
# templates against the Kubernetes schemas, the collective jobs' sizes and names
# (scripts/check-k8s-collective.py), and the pod entrypoint's environment contract for each
# role. Exits non-zero on any failure.
#
#   scripts/validate-k8s.sh            (needs `kubernetes-validate` on PATH, or
#                                       KUBERNETES_VALIDATE=/path/to/kubernetes-validate; and a
#                                       Python with PyYAML and jsonschema: K8S_PYTHON, default
#                                       the venv's python beside the validator, else python3)
# .ci/run installs the validator, jsonschema and PyYAML from PyPI into a venv and calls this script.
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
PYTHON="${K8S_PYTHON:-}"
if [ -z "$PYTHON" ]; then
    PYTHON=python3
    validator_path="$(command -v "$VALIDATOR")"
    if [ -x "$(dirname "$validator_path")/python" ]; then
        PYTHON="$(dirname "$validator_path")/python"
    fi
fi
if ! "$PYTHON" -c 'import jsonschema, yaml' 2>/dev/null; then
    echo "validate-k8s: '$PYTHON' lacks jsonschema or PyYAML; install them with 'pip install jsonschema pyyaml' (or set K8S_PYTHON)" >&2
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

# Collective jobs (deploy/k8s/collective). The Indexed Job form is plain Kubernetes: the same
# strict schema check. The MPIJob is a custom resource kubernetes-validate has no schema for: it
# is checked against the MPI Operator's CRD (deploy/k8s/crds) with unknown fields refused, and
# its pod templates, wrapped as v1 PodTemplates, against the Kubernetes schemas.
CRD=deploy/k8s/crds/kubeflow.org_mpijobs.yaml
COLLECTIVE="$(mktemp -d)"
trap 'rm -rf "$COLLECTIVE"' EXIT
k8s_strict() { # files...: kubernetes-validate --strict, failing on its warnings too
    local report="$COLLECTIVE/report" rc=0
    "$VALIDATOR" --strict --kubernetes-version "$K8S_VERSION" "$@" >"$report" 2>&1 || rc=$?
    cat "$report"
    if grep -q '^WARN' "$report"; then rc=1; fi
    return "$rc"
}
echo "validate-k8s: collective jobs: the Indexed Job against Kubernetes $K8S_VERSION (strict)"
if ! k8s_strict deploy/k8s/collective/indexed-job.yaml; then
    echo "validate-k8s: deploy/k8s/collective/indexed-job.yaml does not validate" >&2
    exit 1
fi
echo "validate-k8s: collective jobs: the MPIJob against $CRD, its pod templates against Kubernetes $K8S_VERSION"
mkdir "$COLLECTIVE/pods"
if ! "$PYTHON" scripts/validate-crd.py --crd "$CRD" --pod-templates "$COLLECTIVE/pods" \
    deploy/k8s/collective/mpijob.yaml; then
    echo "validate-k8s: deploy/k8s/collective/mpijob.yaml does not match the MPIJob CRD" >&2
    exit 1
fi
pod_templates=("$COLLECTIVE"/pods/*.yaml)
if [ "${#pod_templates[@]}" -ne 2 ]; then
    echo "validate-k8s: expected the MPIJob's two pod templates (Launcher, Worker), got ${#pod_templates[@]}" >&2
    exit 1
fi
if ! k8s_strict "${pod_templates[@]}"; then
    echo "validate-k8s: the MPIJob's pod templates do not validate" >&2
    exit 1
fi
"$PYTHON" scripts/check-k8s-collective.py .
# The checks refuse what they should: misspelt fields of the MPIJob (top level, nested, in a
# container), the Worker's container field seen through its PodTemplate, a size that disagrees.
refused() { # sed-expression what: the MPIJob's CRD check must fail on the edited copy
    sed "$1" deploy/k8s/collective/mpijob.yaml >"$COLLECTIVE/bad.yaml"
    if cmp -s deploy/k8s/collective/mpijob.yaml "$COLLECTIVE/bad.yaml"; then
        echo "validate-k8s: self-test '$1' changed nothing" >&2
        exit 1
    fi
    if "$PYTHON" scripts/validate-crd.py --crd "$CRD" "$COLLECTIVE/bad.yaml" >/dev/null 2>&1; then
        echo "validate-k8s: scripts/validate-crd.py accepted an MPIJob with $2" >&2
        exit 1
    fi
}
refused 's/slotsPerWorker:/slotPerWorker:/' "a misspelt slotsPerWorker"
refused 's/cleanPodPolicy:/cleanPolicy:/' "a misspelt runPolicy.cleanPodPolicy"
refused 's/cleanPodPolicy: Running/cleanPodPolicy: Runing/' "an unknown cleanPodPolicy"
refused 's/readinessProbe:/readynessProbe:/' "a misspelt container field"
refused 's/^    Launcher:/    Lancher:/' "a misspelt replica type"
sed 's/readinessProbe:/readynessProbe:/' deploy/k8s/collective/mpijob.yaml >"$COLLECTIVE/bad.yaml"
mkdir "$COLLECTIVE/badpods"
"$PYTHON" scripts/validate-crd.py --crd "$CRD" --pod-templates "$COLLECTIVE/badpods" \
    "$COLLECTIVE/bad.yaml" >/dev/null 2>&1 || true
bad_pods=("$COLLECTIVE"/badpods/*.yaml)
if [ "${#bad_pods[@]}" -ne 2 ] || k8s_strict "${bad_pods[@]}" >/dev/null 2>&1; then
    echo "validate-k8s: kubernetes-validate accepted a PodTemplate with a misspelt container field" >&2
    exit 1
fi
mkdir -p "$COLLECTIVE/tree/deploy/k8s"
cp -r deploy/k8s/collective deploy/k8s/ssh deploy/k8s/Dockerfile "$COLLECTIVE/tree/deploy/k8s/"
sed -i 's/^      replicas: 4$/      replicas: 3/' "$COLLECTIVE/tree/deploy/k8s/collective/mpijob.yaml"
if cmp -s deploy/k8s/collective/mpijob.yaml "$COLLECTIVE/tree/deploy/k8s/collective/mpijob.yaml" ||
    "$PYTHON" scripts/check-k8s-collective.py "$COLLECTIVE/tree" >/dev/null 2>&1; then
    echo "validate-k8s: scripts/check-k8s-collective.py accepted 3 workers for --nproc 4" >&2
    exit 1
fi
rm -rf "$COLLECTIVE"
trap - EXIT
echo "validate-k8s: collective jobs OK (and the checks refuse misspelt fields and sizes that disagree)"

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
