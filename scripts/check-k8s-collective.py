#!/usr/bin/env python3
"""Checks that the collective jobs of deploy/k8s/collective agree with themselves and the image.

    check-k8s-collective.py [REPO_ROOT]

The schemas cannot see that the numbers and names of a job must match each other; this does:
- indexed-job.yaml: the Job's completions = parallelism = `--worker_num` = `--devices`, one rank
  per pod (`--local_worker_num 1`); `--master_addr` is pod 0's DNS name (`<job>-0.<subdomain>`),
  the subdomain is the headless Service, whose selector takes the pods and whose port is
  `--master_port` and the container's; `--node_rank` is the pod's completion index.
- mpijob.yaml: Worker replicas × slotsPerWorker = `--nproc` = `--devices`; `--hostfile` is the
  operator's /etc/mpi/hostfile; sshAuthMountPath is the home of the image's user plus /.ssh,
  where deploy/k8s/ssh/sshd_config finds its keys; the workers' port is sshd's and ssh's.
Exits 1 naming every disagreement.
"""

import os
import re
import sys

import yaml

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
K8S = os.path.join(ROOT, "deploy", "k8s")
errors = []


def check(ok, message):
    if not ok:
        errors.append(message)


def load(name):
    with open(os.path.join(K8S, "collective", name), encoding="utf-8") as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def flag(args, name):
    """The value after `name` in args (the first occurrence), or None."""
    return args[args.index(name) + 1] if name in args else None


def container(template):
    return template["spec"]["containers"][0]


def config_value(path, key):
    with open(os.path.join(K8S, path), encoding="utf-8") as f:
        for line in f:
            words = line.split()
            if len(words) == 2 and words[0] == key:
                return words[1]
    return None


# The indexed Job.
docs = load("indexed-job.yaml")
service, job = docs["Service"], docs["Job"]
spec = job["spec"]
pod = spec["template"]
c = container(pod)
args = c["args"]
launcher, command = args[: args.index("--")], args[args.index("--") + 1 :]
ranks = spec["completions"]
check(spec.get("completionMode") == "Indexed", "indexed-job: completionMode is not Indexed")
check(spec["parallelism"] == ranks, "indexed-job: parallelism differs from completions")
check(flag(launcher, "--worker_num") == str(ranks), "indexed-job: --worker_num is not completions")
check(flag(launcher, "--local_worker_num") == "1", "indexed-job: --local_worker_num is not 1")
check(flag(command, "--devices") == str(ranks), "indexed-job: --devices is not completions")
subdomain = pod["spec"].get("subdomain")
check(subdomain == service["metadata"]["name"], "indexed-job: subdomain is not the Service")
check(service["spec"].get("clusterIP") == "None", "indexed-job: the Service is not headless")
master = f"{job['metadata']['name']}-0.{subdomain}"
check(flag(launcher, "--master_addr") == master, f"indexed-job: --master_addr is not {master}")
labels = pod["metadata"]["labels"]
check(
    all(labels.get(k) == v for k, v in service["spec"]["selector"].items()),
    "indexed-job: the Service's selector does not take the Job's pods",
)
port = flag(launcher, "--master_port")
check(
    [str(p["port"]) for p in service["spec"]["ports"]] == [port],
    "indexed-job: the Service's port is not --master_port",
)
check(
    [str(p["containerPort"]) for p in c.get("ports", [])] == [port],
    "indexed-job: the container's port is not --master_port",
)
rank_arg = flag(launcher, "--node_rank") or ""
m = re.fullmatch(r"\$\((\w+)\)", rank_arg)
env = {e["name"]: e for e in c.get("env", [])}
index_path = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
check(
    m is not None
    and env.get(m.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    == index_path,
    "indexed-job: --node_rank is not $(VAR) of a variable set from the completion index",
)
check(command[:2] == ["tessera", "train"], "indexed-job: the command is not `tessera train`")

# The MPIJob.
mpijob = load("mpijob.yaml")["MPIJob"]
spec = mpijob["spec"]
workers = spec["mpiReplicaSpecs"]["Worker"]
launcher_c = container(spec["mpiReplicaSpecs"]["Launcher"]["template"])
args = launcher_c["args"]
launcher, command = args[: args.index("--")], args[args.index("--") + 1 :]
ranks = workers["replicas"] * spec.get("slotsPerWorker", 1)
check(args[:2] == ["tessera", "launch"], "mpijob: the launcher does not run `tessera launch`")
check(flag(launcher, "--nproc") == str(ranks), "mpijob: --nproc is not replicas × slotsPerWorker")
check(flag(command, "--devices") == str(ranks), "mpijob: --devices is not replicas × slotsPerWorker")
check(flag(launcher, "--hostfile") == "/etc/mpi/hostfile", "mpijob: --hostfile is not the operator's")
check(command[:2] == ["tessera", "train"], "mpijob: the command is not `tessera train`")
with open(os.path.join(K8S, "Dockerfile"), encoding="utf-8") as f:
    home = re.search(r"useradd .*--home-dir (\S+)", f.read())
ssh_dir = f"{home.group(1)}/.ssh" if home else None
check(spec["sshAuthMountPath"] == ssh_dir, f"mpijob: sshAuthMountPath is not {ssh_dir}")
check(
    config_value("ssh/sshd_config", "HostKey") == f"{ssh_dir}/id_rsa"
    and config_value("ssh/sshd_config", "AuthorizedKeysFile") == f"{ssh_dir}/authorized_keys",
    "mpijob: sshd_config's keys are not under sshAuthMountPath",
)
worker_c = container(workers["template"])
sshd_port = config_value("ssh/sshd_config", "Port")
check(config_value("ssh/ssh_config", "Port") == sshd_port, "mpijob: ssh and sshd use other ports")
check(
    [str(p["containerPort"]) for p in worker_c.get("ports", [])] == [sshd_port],
    "mpijob: the workers' port is not sshd's",
)
check(
    worker_c["args"][:1] == ["/usr/sbin/sshd"] and "/etc/ssh/tessera_sshd_config" in worker_c["args"],
    "mpijob: the workers do not run sshd with the image's tessera_sshd_config",
)

for e in errors:
    print(f"check-k8s-collective: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print("check-k8s-collective: the collective jobs' sizes, names and ports agree")
