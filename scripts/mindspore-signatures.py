"""Writes tests/fixtures/mindspore/signatures.json: the parameter names, kinds and defaults of the
mindspore.parallel functions that tessera.parallel mirrors, as MindSpore itself declares them.

Run in a venv with MindSpore installed (pip install mindspore==2.10.0):
    python scripts/mindspore-signatures.py tests/fixtures/mindspore/signatures.json
"""
import inspect
import json
import sys

import mindspore
import mindspore.parallel as P

NAMES = [
    "convert_checkpoints",
    "convert_checkpoint_by_rank",
    "rank_list_for_convert",
    "unified_safetensors",
    "load_distributed_checkpoint",
    "load_segmented_checkpoints",
    "build_searched_strategy",
    "merge_pipeline_strategys",
    "restore_group_info_list",
]


def describe(func):
    params = []
    for p in inspect.signature(func).parameters.values():
        entry = {"name": p.name, "kind": p.kind.name}
        if p.default is not inspect.Parameter.empty:
            entry["default"] = repr(p.default)
        params.append(entry)
    return params


def main(out):
    sigs = {name: describe(getattr(P, name)) for name in NAMES}
    sigs["Layout.__init__"] = describe(P.Layout.__init__)[1:]
    sigs["Layout.__call__"] = describe(P.Layout.__call__)[1:]
    sigs["Layout.to_dict"] = describe(P.Layout.to_dict)[1:]
    doc = {"mindspore": mindspore.__version__, "signatures": sigs}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
