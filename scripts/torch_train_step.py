"""PyTorch baseline for `tessera bench train-step`: the seed MLP (784-512-512-10, plain matmuls,
no biases, ReLU, cross entropy, batch 32, f32) trained with SGD momentum 0.9 on one thread,
eight pseudo-random batches cycled. Prints the median step time and the 10th/90th percentiles."""
import statistics
import sys
import time

import torch

torch.set_num_threads(1)
torch.manual_seed(1)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300

w1 = torch.nn.Parameter(torch.empty(784, 512).uniform_(-0.087, 0.087))
w2 = torch.nn.Parameter(torch.empty(512, 512).uniform_(-0.108, 0.108))
w3 = torch.nn.Parameter(torch.empty(512, 10).uniform_(-0.108, 0.108))
opt = torch.optim.SGD([w1, w2, w3], lr=0.01, momentum=0.9)
batches = [(torch.rand(32, 28, 28), torch.randint(0, 10, (32,))) for _ in range(8)]


def step(i):
    x, y = batches[i % len(batches)]
    h = torch.relu(torch.flatten(x, 1) @ w1)
    h = torch.relu(h @ w2)
    loss = torch.nn.functional.cross_entropy(h @ w3, y)
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    return loss


for i in range(20):
    step(i)
times = []
for i in range(steps):
    start = time.perf_counter()
    step(i)
    times.append((time.perf_counter() - start) * 1e3)
times.sort()
print(
    f"pytorch {torch.__version__}, 1 thread: {statistics.median(times):.3f} ms/step median "
    f"[p10 {times[len(times) // 10]:.3f} - p90 {times[len(times) * 9 // 10]:.3f}]"
)
