#!/usr/bin/env python3
"""Tessera's 1 rank against PyTorch's single thread on the GPT benchmark model (4 layers, 4
heads, width 256, 128 tokens, batch 16, f32, AdamW), step by step: both engines run as paced
children (`tessera bench gpt-step --paced`, `scripts/torch_gpt_step.py --paced`), and each
round runs one step of each back to back, the order alternating, so a drift of a shared
machine's speed reaches both steps of a round alike. Prints each round's throughput ratio
(PyTorch's step time over Tessera's), then their median, p10-p90 and range, and the median step
of each engine.

    python3 scripts/bench-gpt-lockstep.py --tessera target-release/release/tessera \\
        --python <venv>/bin/python [--steps 40]

`scripts/bench-gpt-pairs.sh` pairs whole runs a few seconds apart; this pairs single steps. Each
step here runs after the other engine's step has evicted its data from the shared L3 cache: on
an Ice Lake Xeon that made Tessera's step about 25 % slower than alone and PyTorch's about 10 %
(docs/PERFORMANCE.md), so the two measures answer different questions; report both.
"""
import argparse
import os
import statistics
import subprocess
import sys


class Paced:
    """A paced child: started, warmed up, then stepped one line at a time."""

    def __init__(self, name, argv):
        self.name = name
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.header = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.fail("ended before it was ready")
            line = line.rstrip("\n")
            if line == "ready":
                break
            self.header.append(line)

    def fail(self, what):
        self.proc.kill()
        sys.exit(f"{self.name}: {what} (exit status {self.proc.wait()})")

    def step(self):
        """Runs one step; its milliseconds as the child timed it."""
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if not line.startswith("step "):
            self.fail(f"answered {line!r} instead of 'step <ms>'")
        return float(line.split()[1])

    def close(self):
        self.proc.stdin.close()
        if self.proc.wait() != 0:
            sys.exit(f"{self.name}: exit status {self.proc.returncode}")


def quantile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tessera", required=True, help="the tessera binary (a release build)")
    ap.add_argument("--python", required=True, help="a Python with PyTorch")
    ap.add_argument("--steps", type=int, default=40, help="timed rounds (each one step of each)")
    args = ap.parse_args()
    if not 1 <= args.steps <= 10_000:
        sys.exit(f"--steps {args.steps}: must be 1 to 10000")
    with open("/proc/loadavg") as f:
        print(f"== {os.cpu_count()} cores, load {' '.join(f.read().split()[:3])}")
    tessera = Paced("tessera", [args.tessera, "bench", "gpt-step", "--paced",
                                "--steps", str(args.steps)])
    for line in tessera.header:
        if line.startswith("machine: "):
            print("== " + line[len("machine: "):])
    torch = Paced("pytorch", [args.python, os.path.join(here, "torch_gpt_step.py"),
                              str(args.steps), "--paced"])
    ratios, t_ms, p_ms = [], [], []
    for i in range(args.steps):
        if i % 2 == 0:
            p, t = torch.step(), tessera.step()
        else:
            t, p = tessera.step(), torch.step()
        t_ms.append(t)
        p_ms.append(p)
        ratios.append(p / t)
    tessera.close()
    torch.close()
    r = sorted(ratios)
    print("rounds (pytorch ms / tessera ms): " + " ".join(f"{x:.2f}" for x in ratios))
    print(f"pytorch 1 thread median step {statistics.median(p_ms):.1f} ms, "
          f"tessera 1 rank {statistics.median(t_ms):.1f} ms")
    print(f"tessera 1 rank / pytorch 1 thread, step by step: {statistics.median(r):.2f}x "
          f"(median of {len(r)} rounds, p10-p90 {quantile(r, 0.1):.2f}-{quantile(r, 0.9):.2f}, "
          f"range {r[0]:.2f}-{r[-1]:.2f})")


if __name__ == "__main__":
    main()
