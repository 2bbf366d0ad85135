#!/usr/bin/env bash
# Tests the ssh side of collective/mpijob.yaml without Kubernetes or the image: the workers'
# sshd (ssh/sshd_config) run as the image's user, the launcher's ssh client (ssh/ssh_config)
# and mpirun over ssh with the MPI Operator's hostfile and key conventions, on Debian bookworm's
# OpenSSH and OpenMPI 4.1 (the runtime stage's packages).
#
# In a bookworm root (made with debootstrap when ROOT has none) it installs the two ssh files where
# the Dockerfile puts them, the image's user (uid 10001, home /opt/tessera), an operator-style
# key (ECDSA P-521 in PEM as id_rsa, id_rsa.pub and authorized_keys, root-owned, mode 0644, in
# /opt/tessera/.ssh) and a hostfile in the operator's format. Then, in a private mount, network
# and UTS namespace (nothing on the host's network changes), two network namespaces on a bridge
# stand in for worker pods, with host names tessera-mpi-worker-<i> and their full names in
# /etc/hosts only; each runs sshd as uid 10001 as the Worker does; uid 10001 in the "launcher"
# namespace, with the OMPI_MCA_* variables the operator sets, runs `mpirun -np 2` twice: with
# the options `tessera launch --hostfile /etc/mpi/hostfile` gives it, and with no host file
# but the operator's variable. Passes when, both times, mpirun prints nothing but one tagged
# line per rank, rank i on worker i with OpenMPI's rank variables and the forwarded restart
# count set. Needs root, debootstrap, unshare and ip.
#
#   deploy/k8s/test-mpijob-ssh.sh ROOT       (ROOT: a directory for the bookworm root, kept for
#                                             reuse; MIRROR: the Debian mirror for debootstrap)
set -euo pipefail
root="${1:?usage: test-mpijob-ssh.sh ROOT}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
here="$(cd "$(dirname "$0")" && pwd)"

if [ "${TESSERA_SSH_TEST_INSIDE-}" != 1 ]; then
    if [ ! -x "$root/usr/sbin/sshd" ] || [ ! -x "$root/usr/bin/mpirun" ]; then
        debootstrap --variant=minbase --include=openmpi-bin,openssh-server,openssh-client \
            bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1
    fi
    chroot "$root" sh -c 'rm -f /etc/ssh/ssh_host_*
        id tessera >/dev/null 2>&1 ||
            useradd --system --uid 10001 --home-dir /opt/tessera --no-create-home tessera 2>/dev/null
        mkdir -p /opt/tessera /var/run/tessera /etc/mpi
        chown tessera:tessera /var/run/tessera'
    cp "$here/ssh/sshd_config" "$root/etc/ssh/tessera_sshd_config"
    cp "$here/ssh/ssh_config" "$root/etc/ssh/ssh_config.d/tessera.conf"
    keys="$root/opt/tessera/.ssh"
    rm -rf "$keys"
    mkdir -p "$keys"
    ssh-keygen -q -t ecdsa -b 521 -m PEM -N '' -f "$keys/id_rsa"
    cp "$keys/id_rsa.pub" "$keys/authorized_keys"
    chown root:root "$keys"/*
    chmod 0644 "$keys"/*
    printf '%s slots=1\n' tessera-mpi-worker-{0,1}.tessera-mpi.default.svc >"$root/etc/mpi/hostfile"
    touch "$root/etc/hosts"
    sed -i '/tessera-mpi/d' "$root/etc/hosts"
    printf '10.231.0.%s tessera-mpi-%s.tessera-mpi.default.svc\n' \
        1 launcher 2 worker-0 3 worker-1 >>"$root/etc/hosts"
    TESSERA_SSH_TEST_INSIDE=1 exec unshare --mount --net --uts --fork "$0" "$root"
fi

# Inside the private namespaces (unshare makes the mounts private: they end with it).
mkdir -p /run/netns
mount -t tmpfs none /run/netns
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
hostname tessera-mpi-launcher
ip link set lo up
ip link add tsbr type bridge
ip addr add 10.231.0.1/24 dev tsbr
ip link set tsbr up
sshd_pids=()
rm -f "$root"/sshd-{0,1}.log
for i in 0 1; do
    ip netns add "w$i"
    ip link add "v$i" type veth peer name "p$i"
    ip link set "p$i" netns "w$i"
    ip link set "v$i" master tsbr
    ip link set "v$i" up
    ip netns exec "w$i" ip link set lo up
    ip netns exec "w$i" ip addr add "10.231.0.$((2 + i))/24" dev "p$i"
    ip netns exec "w$i" ip link set "p$i" up
    # As the Worker's container runs it: /usr/sbin/sshd -De -f /etc/ssh/tessera_sshd_config.
    ip netns exec "w$i" unshare --uts sh -c "hostname tessera-mpi-worker-$i
        exec chroot --userspec=10001:10001 '$root' /usr/sbin/sshd -De -f /etc/ssh/tessera_sshd_config" \
        2>"$root/sshd-$i.log" &
    sshd_pids+=("$!")
done
trap 'kill "${sshd_pids[@]}" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    listening="$(grep -l 'listening on 0.0.0.0 port 2222' "$root"/sshd-{0,1}.log 2>/dev/null | wc -l)"
    [ "$listening" = 2 ] && break
    sleep 0.2
done
# Each rank prints OpenMPI's rank variables, the restart count `-x` forwards, and its host.
rank_cmd='echo "rank=$OMPI_COMM_WORLD_RANK size=$OMPI_COMM_WORLD_SIZE"'\
' "local=$OMPI_COMM_WORLD_LOCAL_RANK restart=$TESSERA_RESTART_COUNT host=$(hostname)"'
expected="[1,0]<stdout>:rank=0 size=2 local=0 restart=3 host=tessera-mpi-worker-0
[1,1]<stdout>:rank=1 size=2 local=0 restart=3 host=tessera-mpi-worker-1"
# run NAME MPIRUN_ARGS…: mpirun as uid 10001 with the environment the operator gives the
# launcher's container (OpenMPI 4's names); passes when its whole output (mpirun's own
# messages included, so a warning fails) is one tagged line per rank, rank i on worker i.
run() {
    local name="$1" out
    shift
    out="$(chroot --userspec=10001:10001 "$root" env HOME=/opt/tessera K_MPI_JOB_ROLE=launcher \
        OMPI_MCA_orte_keep_fqdn_hostnames=true OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile \
        OMPI_MCA_plm_rsh_args="-o ConnectionAttempts=10" TESSERA_RESTART_COUNT=3 \
        timeout 60 mpirun -np 2 "$@" sh -c "$rank_cmd" 2>&1)" || true
    echo "$name:"
    echo "$out"
    if [ "$(echo "$out" | sort)" != "$expected" ]; then
        echo "test-mpijob-ssh: $name: expected exactly one tagged line from each worker;" \
            "sshd's logs:" >&2
        cat "$root"/sshd-*.log >&2
        exit 1
    fi
}
# As `tessera launch --nproc 2 --hostfile /etc/mpi/hostfile` runs it (crates/cli/src/launch/
# collective/mpirun.rs, a host file's job; the launcher runs as uid 10001, not as root).
run "tessera launch's mpirun" --oversubscribe --bind-to none --tag-output \
    -x TESSERA_RESTART_COUNT --hostfile /etc/mpi/hostfile
# With no --hostfile: the operator's OMPI_MCA_orte_default_hostfile alone names the workers.
run "the operator's hostfile variable" --tag-output -x TESSERA_RESTART_COUNT
echo "test-mpijob-ssh: mpirun reached both workers' sshd as uid 10001 and ran rank i on worker i"
