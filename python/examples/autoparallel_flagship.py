import os
import tessera as ms
import tessera.dataset as ds
from tessera import nn, ops
from tessera.communication import init, get_rank
from tessera.common.initializer import initializer
from tessera.parallel.auto_parallel import AutoParallel
from tessera.train import Model
from tessera.train import LossMonitor
ms.set_context(mode=ms.GRAPH_MODE)
init()
ms.set_seed(1)

def create_dataset(batch_size):
    dataset_path = os.getenv("DATA_PATH")
    dataset = ds.MnistDataset(dataset_path)
    image_transforms = [
        ds.vision.Rescale(1.0 / 255.0, 0),
        ds.vision.Normalize(mean=(0.1307,), std=(0.3081,)),
        ds.vision.HWC2CHW()
    ]
    label_transform = ds.transforms.TypeCast(ms.int32)
    dataset = dataset.map(image_transforms, 'image')
    dataset = dataset.map(label_transform, 'label')
    dataset = dataset.batch(batch_size)
    return dataset

dataset = create_dataset(32)

from tessera import nn, ops, Parameter
from tessera.common.initializer import initializer, HeUniform
import math

class MatMulCell(nn.Cell):
    def __init__(self, param=None, shape=None):
        super().__init__()
        if shape is None:
            shape = [28 * 28, 512]
        weight_init = HeUniform(math.sqrt(5))
        self.param = Parameter(initializer(weight_init, shape), name="param")
        if param is not None:
            self.param = param
        self.print = ops.Print()
        self.matmul = ops.MatMul()

    def construct(self, x):
        out = self.matmul(x, self.param)
        self.print("out is:", out)
        return out

class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.layer1 = MatMulCell()
        self.relu1 = nn.ReLU()
        self.layer2 = nn.Dense(512, 512)
        self.relu2 = nn.ReLU()
        self.layer3 = nn.Dense(512, 10)

    def construct(self, x):
        x = self.flatten(x)
        x = self.layer1(x)
        x = self.relu1(x)
        x = self.layer2(x)
        x = self.relu2(x)
        logits = self.layer3(x)
        return logits

import tessera as ms
from tessera import nn, ops
from tessera.parallel.nn import Pipeline, PipelineGradReducer
from tessera.nn.utils import no_init_parameters

with no_init_parameters():
    net = Network()
    optimizer = nn.SGD(net.trainable_params(), 1e-2)
    pp_grad_reducer = PipelineGradReducer(optimizer.parameters, opt_shard=False)

loss_fn = nn.CrossEntropyLoss()
net_with_loss = Pipeline(nn.WithLossCell(net, loss_fn), 4, stage_config={"_backbone.flatten":0,
    "_backbone.layer1": 0, "_backbone.relu1": 0, "_backbone.layer2": 1,
    "_backbone.relu2": 1, "_backbone.layer3": 1})
parallel_net = AutoParallel(net_with_loss, parallel_mode="semi_auto")
parallel_net.hsdp()
parallel_net.pipeline(stages=2)
parallel_net.dataset_strategy("data_parallel")
parallel_net.save_param_strategy_file(f"/tmp/param_{get_rank()}.ckpt")
parallel_net.set_group_ckpt_save_file(f"/tmp/comm_group_{get_rank()}.ckpt")
parallel_net.dump_local_norm(f"/tmp/local_norm_{get_rank()}")
parallel_net.disable_strategy_file_only_for_trainable_params()
parallel_net.enable_fp32_communication()
parallel_net.enable_device_local_norm()
parallel_net.enable_gradients_mean()
parallel_net.disable_gradient_fp32_sync()
parallel_net.disable_loss_repeated_mean()


loss_monitor = LossMonitor(per_print_times=1)
model = Model(network=parallel_net, optimizer=optimizer)
model.train(epoch=2, train_dataset=dataset, callbacks=[loss_monitor])
