"""accelerate as its quick tour writes it: a plain ``Accelerator()``, ``prepare``, a training
loop with ``accelerator.backward``. Nothing in it asks for the CPU: on CPU hosts that is the
launcher's business (``ACCELERATE_USE_CPU=1``), as accelerate's docs say.

Every process prints one JSON line: what accelerate saw, and, when it is distributed, a
reduce of ``process_index + 1`` and whether every process's weights agree.
"""

import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType


def main() -> None:
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    dataloader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
    for inputs, targets in dataloader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
    record = {
        "accelerate": True,
        "rank": int(os.environ.get("RANK", "-1")),
        "machine_rank": int(os.environ.get("GROUP_RANK", "-1")),
        "num_processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
    }
    if accelerator.distributed_type != DistributedType.NO:
        index = torch.tensor([float(accelerator.process_index + 1)])
        record["sum"] = accelerator.reduce(index, reduction="sum").item()
        weights = accelerator.unwrap_model(model)[0].weight.detach().reshape(1, -1)
        everyone = accelerator.gather(weights)
        record["weights_agree"] = bool(torch.allclose(everyone, everyone[0].expand_as(everyone)))
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
