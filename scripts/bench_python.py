"""Driver of scripts/bench-python.sh: times the 1 GiB 8→4 conversion by tessera.parallel,
MindSpore and the tessera CLI (each durable, and the Tessera ones also without fsync:
``fsync=False`` / ``--no-fsync``, the like-for-like comparison with MindSpore, which never
fsyncs), each in its own process under /usr/bin/time (peak RSS), the variants interleaved, and
prints a table (median and min–max over the repetitions)."""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile

CALL = """
import sys, time
import {module} as P
src, dst, a, b = sys.argv[1:5]
t = time.perf_counter()
P.convert_checkpoints(src, dst, "checkpoint_", a, b, output_format="safetensors"{extra})
print(time.perf_counter() - t)
"""


def timed(cmd):
    """(wall seconds of the process, peak RSS in KiB, stdout) of one run."""
    with tempfile.NamedTemporaryFile("r") as out:
        proc = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", out.name, *cmd],
                              check=True, stdout=subprocess.PIPE, text=True)
        wall, rss = out.read().split()[-2:]
    return float(wall), int(rss), proc.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--ms-python", required=True)
    ap.add_argument("--py-python", required=True)
    ap.add_argument("--only", default="python,python-nofsync,mindspore,cli,cli-nofsync",
                    help="comma-separated variants to run, in this order each repetition")
    args = ap.parse_args()
    gen = os.path.join(args.work, "gen")
    src, a, b = os.path.join(gen, "src"), os.path.join(gen, "A.ckpt"), os.path.join(gen, "B.ckpt")
    def call(python, module, extra=""):
        return lambda dst: [python, "-c", CALL.format(module=module, extra=extra), src, dst, a, b]

    def cli(*extra):
        return lambda dst: [args.tessera, "ckpt", "convert", "--src", src, "--src-strategy", a,
                            "--dst", dst, "--dst-strategy", b, "--format", "safetensors",
                            "--quiet", *extra]

    every = {
        "python": call(args.py_python, "tessera.parallel"),
        "python-nofsync": call(args.py_python, "tessera.parallel", ", fsync=False"),
        "mindspore": call(args.ms_python, "mindspore.parallel"),
        "cli": cli(),
        "cli-nofsync": cli("--no-fsync"),
    }
    labels = {"python": "tessera.parallel (Python)",
              "python-nofsync": "tessera.parallel fsync=False (Python)",
              "mindspore": "mindspore.parallel 2.10",
              "cli": "tessera ckpt convert (CLI)",
              "cli-nofsync": "tessera ckpt convert --no-fsync (CLI)"}
    unknown = [k for k in args.only.split(",") if k not in every]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(every)}")
    variants = {labels[key]: every[key] for key in args.only.split(",")}
    results = {name: {"call": [], "wall": [], "rss": []} for name in variants}
    for rep in range(args.reps):
        for name, cmd in variants.items():
            dst = os.path.join(args.work, "dst")  # made by the run, removed before the next
            shutil.rmtree(dst, ignore_errors=True)
            os.sync()
            wall, rss, out = timed(cmd(dst))
            call = float(out.strip().splitlines()[-1]) if "CLI" not in name else wall
            for key, value in (("call", call), ("wall", wall), ("rss", rss)):
                results[name][key].append(value)
            print(f"rep {rep + 1}: {name}: call {call:.3f} s, process {wall:.2f} s, peak RSS {rss / 1024:.1f} MiB", flush=True)
            shutil.rmtree(dst, ignore_errors=True)

    def stat(xs, fmt):
        return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}–{fmt(max(xs))})"

    secs = lambda x: f"{x:.3f} s"
    mib = lambda x: f"{x / 1024:.0f} MiB"
    print()
    print("| | conversion call, median (min–max) | whole process | peak RSS |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {stat(r['call'], secs)} | {stat(r['wall'], secs)} | {stat(r['rss'], mib)} |")
    t, t0, m, c, c0 = (results.get(labels[k]) for k in
                       ("python", "python-nofsync", "mindspore", "cli", "cli-nofsync"))
    med = statistics.median
    print()
    for ours, how in ((t, "fsynced"), (t0, "fsync=False, like MindSpore")):
        if ours and m:
            print(f"MindSpore / tessera.parallel ({how}): "
                  f"{med(m['call']) / med(ours['call']):.1f}× the time, "
                  f"{med(m['rss']) / med(ours['rss']):.1f}× the peak RSS")
    for ours, cmd, how in ((t, c, "fsynced"), (t0, c0, "without fsync")):
        if ours and cmd:
            print(f"tessera.parallel call / CLI process ({how}): "
                  f"{med(ours['call']) / med(cmd['wall']):.3f}")


if __name__ == "__main__":
    main()
