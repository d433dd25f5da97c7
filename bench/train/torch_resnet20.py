"""PyTorch's ResNet-20 as cohort's cnn:resnet20 builds it (conv3x3x16-bn-relu, 3 stages of 3
basic blocks at 16/32/64 channels, stride 2 and a 1x1 projection shortcut with bias entering
stages 2 and 3, global average pooling, fc10; convolutions with bias), trained on random
1x28x28 inputs (Fashion-MNIST's shape) at batch 64 with SGD momentum 0.9: samples/s, to set
beside `cohort-bench-train --models resnet20`. Usage: torch_resnet20.py THREADS [SECONDS]
(set OMP_NUM_THREADS to THREADS too). Needs Debian's python3-torch; a peer comparison only."""
import sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, cin, cout, stride):
        super().__init__()
        s.c1 = nn.Conv2d(cin, cout, 3, stride, 1); s.b1 = nn.BatchNorm2d(cout)
        s.c2 = nn.Conv2d(cout, cout, 3, 1, 1); s.b2 = nn.BatchNorm2d(cout)
        s.proj = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(s, x):
        y = s.b2(s.c2(F.relu(s.b1(s.c1(x)))))
        return F.relu(y + (s.proj(x) if s.proj is not None else x))


class ResNet20(nn.Module):
    def __init__(s, cin=1, classes=10):
        super().__init__()
        s.c = nn.Conv2d(cin, 16, 3, 1, 1); s.b = nn.BatchNorm2d(16)
        blocks, c = [], 16
        for w in (16, 32, 64):
            for i in range(3):
                blocks.append(Block(c, w, 2 if i == 0 and w != 16 else 1)); c = w
        s.blocks = nn.Sequential(*blocks); s.fc = nn.Linear(64, classes)

    def forward(s, x):
        x = s.blocks(F.relu(s.b(s.c(x))))
        return s.fc(x.mean((2, 3)))


def main():
    threads = int(sys.argv[1]); seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.set_num_threads(threads); torch.manual_seed(0)
    model = ResNet20()
    print(f"params={sum(p.numel() for p in model.parameters())}", flush=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64 * 8, 1, 28, 28); y = torch.randint(0, 10, (64 * 8,))
    step = lambda i: (opt.zero_grad(set_to_none=True),
                      F.cross_entropy(model(x[i % 8 * 64:(i % 8 + 1) * 64]),
                                      y[i % 8 * 64:(i % 8 + 1) * 64]).backward(), opt.step())
    for i in range(3): step(i)  # warm-up
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step(n); n += 1
    dt = time.perf_counter() - t0
    print(f"model=resnet20 threads={threads} steps={n} samples_per_s={n * 64 / dt:.1f}", flush=True)


if __name__ == "__main__":
    main()
