"""Networks and the context reset shared by the network tests (test_nn, test_nn2)."""

import pytest

import tessera
from tessera import nn


@pytest.fixture
def fresh_context():
    """Each test starts and ends with the default parallel context, deterministic mode off and
    seed 1."""
    yield
    tessera.reset_auto_parallel_context()
    tessera.set_context(deterministic="OFF")
    tessera.set_seed(1)


class MLP(nn.Cell):
    """Flatten → Dense+ReLU → Dense, fc1's ops optionally sharded 2×4 on 8 devices."""

    def __init__(self, in_features=64, shard=False):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(in_features, 32, activation="relu")
        self.fc2 = nn.Dense(32, 10)
        if shard:
            # batch split 2 ways, fc1's output features 4 ways (weight [out, in]: (4, 1))
            self.fc1.matmul.shard(((2, 1), (4, 1)))
            self.fc1.bias_add.shard(((2, 4), (4,)))
            self.fc1.activation.relu.shard(((2, 4),))

    def construct(self, x):
        return self.fc2(self.fc1(self.flatten(x)))
