#!/usr/bin/env python3
"""Validates custom resources (e.g. deploy/k8s/collective/mpijob.yaml) against a CRD's schema.

    validate-crd.py --crd CRD.yaml [--pod-templates DIR] MANIFEST.yaml...

Every document of every manifest must be a kind the CRDs define, in a served version, and must
satisfy that version's openAPIV3Schema (JSON Schema through the `jsonschema` package), checked
more strictly than an API server would (which silently drops unknown fields): an object schema
with `properties` and neither `additionalProperties` nor `x-kubernetes-preserve-unknown-fields`
is closed, so a misspelt field is an error, not a field dropped. An MPIJob is also held to the
MPI Operator's own checks (its pkg/apis/kubeflow/validation): the replica types, Launcher
replicas 1, the restart and clean-pod policies, the MPI implementation, the pods' DNS names.

With --pod-templates DIR, every pod template found in a resource (a `template` holding
`spec.containers`) is written to DIR as a `v1 PodTemplate` whose metadata is the resource's
(named `<name>-<path>`), so that kubernetes-validate can check the containers and the object
metadata against the real Kubernetes schemas, which the CRD does not close.

Exits 0 when every document is valid, 1 with every error listed otherwise, 2 on bad usage.
Needs PyYAML and jsonschema (scripts/validate-k8s.sh runs it from the validator's venv).
"""

import argparse
import copy
import os
import re
import sys

import jsonschema
import yaml


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def closed(schema):
    """The schema with every object that lists its properties closed to any other field, and
    `nullable` turned into JSON Schema's null type."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: closed(sub) for name, sub in value.items()}
        elif key in ("enum", "required", "default", "example", "description"):
            out[key] = value
        else:
            out[key] = closed(value)
    open_ended = schema.get("x-kubernetes-preserve-unknown-fields") is True or schema.get(
        "x-kubernetes-embedded-resource"
    )
    if "properties" in out and "additionalProperties" not in out and not open_ended:
        out["additionalProperties"] = False
    if out.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def crd_schemas(paths):
    """(apiVersion, kind) -> the closed openAPIV3Schema of every served version of the CRDs."""
    schemas = {}
    for path in paths:
        for doc in load_all(path):
            if doc.get("kind") != "CustomResourceDefinition":
                raise SystemExit(f"validate-crd: {path}: not a CustomResourceDefinition")
            spec = doc["spec"]
            for version in spec["versions"]:
                if not version.get("served", False):
                    continue
                api_version = f"{spec['group']}/{version['name']}"
                schema = version["schema"]["openAPIV3Schema"]
                schemas[(api_version, spec["names"]["kind"])] = closed(schema)
    return schemas


def where(path):
    return ".".join(str(p) for p in path) or "(the document)"


DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def mpijob_errors(doc):
    """The MPI Operator's own validation of an MPIJob, which the CRD's schema does not hold."""
    errors = []
    spec = doc.get("spec", {})
    replica_specs = spec.get("mpiReplicaSpecs", {})
    for name in replica_specs:
        if name not in ("Launcher", "Worker"):
            errors.append(f"spec.mpiReplicaSpecs.{name}: not a replica type (Launcher, Worker)")
    launcher = replica_specs.get("Launcher")
    if launcher is None:
        errors.append("spec.mpiReplicaSpecs.Launcher: required")
    elif launcher.get("replicas") != 1:
        errors.append("spec.mpiReplicaSpecs.Launcher.replicas: must be 1")
    for name, replica in replica_specs.items():
        if "replicas" not in replica:
            errors.append(f"spec.mpiReplicaSpecs.{name}.replicas: required")
        elif name == "Worker" and replica["replicas"] < 1:
            errors.append(f"spec.mpiReplicaSpecs.{name}.replicas: must be at least 1")
        if replica.get("restartPolicy") not in ("Never", "OnFailure"):
            errors.append(f"spec.mpiReplicaSpecs.{name}.restartPolicy: Never or OnFailure")
        if not replica.get("template", {}).get("spec", {}).get("containers"):
            errors.append(f"spec.mpiReplicaSpecs.{name}.template.spec.containers: required")
    slots = spec.get("slotsPerWorker")
    if slots is None or slots < 0:
        errors.append("spec.slotsPerWorker: required, at least 0")
    if not spec.get("sshAuthMountPath"):
        errors.append("spec.sshAuthMountPath: required")
    if spec.get("mpiImplementation", "OpenMPI") not in ("OpenMPI", "Intel", "MPICH"):
        errors.append("spec.mpiImplementation: OpenMPI, Intel or MPICH")
    policy = spec.get("runPolicy", {}).get("cleanPodPolicy")
    if policy not in ("None", "Running", "All"):
        errors.append("spec.runPolicy.cleanPodPolicy: required, None, Running or All")
    workers = replica_specs.get("Worker", {}).get("replicas", 1)
    hostname = f"{doc.get('metadata', {}).get('name', '')}-worker-{max(workers, 1) - 1}"
    if len(hostname) > 63 or not DNS1035.match(hostname):
        errors.append(f"metadata.name: the pod name {hostname!r} is not a DNS-1035 label")
    return errors


def pod_templates(node, path=()):
    """(path, template) of every pod template (a `template` with `spec.containers`) in node."""
    if isinstance(node, dict):
        for key, value in node.items():
            if (
                key == "template"
                and isinstance(value, dict)
                and isinstance(value.get("spec"), dict)
                and "containers" in value["spec"]
            ):
                yield path + (key,), value
            else:
                yield from pod_templates(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from pod_templates(value, path + (i,))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crd", action="append", required=True, help="a CRD file (repeatable)")
    parser.add_argument("--pod-templates", metavar="DIR", help="write the pod templates here")
    parser.add_argument("manifests", nargs="+")
    args = parser.parse_args()

    schemas = crd_schemas(args.crd)
    failures = 0
    written = 0
    for manifest in args.manifests:
        for index, doc in enumerate(load_all(manifest)):
            label = f"{manifest}[{index}]"
            key = (doc.get("apiVersion"), doc.get("kind"))
            if key not in schemas:
                known = ", ".join(f"{a} {k}" for a, k in sorted(schemas))
                print(f"{label}: no CRD defines {key[0]} {key[1]} (known: {known})")
                failures += 1
                continue
            validator = jsonschema.Draft4Validator(schemas[key])
            errors = [
                f"{where(e.absolute_path)}: {e.message}"
                for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path)))
            ]
            # The operator's checks read a well-typed object: only after the schema's.
            if key[1] == "MPIJob" and not errors:
                errors += mpijob_errors(doc)
            for error in errors:
                print(f"{label} {key[1]} {doc.get('metadata', {}).get('name')}: {error}")
            failures += len(errors)
            if args.pod_templates:
                for path, template in pod_templates(doc.get("spec", {}), ("spec",)):
                    meta = copy.deepcopy(doc.get("metadata", {}))
                    suffix = "-".join(str(p) for p in path if p not in ("spec", "template"))
                    meta["name"] = f"{meta.get('name', 'unnamed')}-{suffix}".lower()
                    wrapped = {
                        "apiVersion": "v1",
                        "kind": "PodTemplate",
                        "metadata": meta,
                        "template": template,
                    }
                    out = os.path.join(args.pod_templates, f"{written:03d}-{meta['name']}.yaml")
                    with open(out, "w", encoding="utf-8") as f:
                        f.write(f"# {label} {key[1]}: {where(path)}\n")
                        yaml.safe_dump(wrapped, f, sort_keys=False)
                    written += 1
            if not errors:
                print(f"{label} {key[1]} {doc.get('metadata', {}).get('name')}: valid")
    if args.pod_templates:
        print(f"validate-crd: {written} pod templates written to {args.pod_templates}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
