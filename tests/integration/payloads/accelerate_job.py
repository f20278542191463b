"""accelerate's Accelerator on CPU across machines: every process joins, gradients agree."""

import json
import os
import sys

import torch
from accelerate import Accelerator


def main() -> None:
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    torch.manual_seed(acc.process_index)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    total = acc.reduce(torch.tensor([float(acc.process_index + 1)]), reduction="sum")
    weights = acc.gather(acc.unwrap_model(model).weight.detach().reshape(1, -1))
    record = {
        "accelerate": True,
        "rank": acc.process_index,
        "world_size": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "machine_rank": int(os.environ.get("GROUP_RANK", -1)),
        "sum": total.item(),
        "weights_agree": bool(torch.allclose(weights, weights[0].expand_as(weights))),
    }
    sys.stdout.write(json.dumps(record) + "\n")  # one write: whole lines in the node's pipe
    sys.stdout.flush()
    acc.wait_for_everyone()  # no rank tears its connections down while others still talk
    acc.end_training()


if __name__ == "__main__":
    main()
