"""A transformers ``Trainer`` as its docs write it, on a tiny randomly initialised GPT-2 (no
download) and a synthetic dataset. ``--use-cpu`` passes ``TrainingArguments(use_cpu=True)``,
which a CPU host needs for the Trainer to train across processes; without it each process
trains alone. ``--fail RANK`` raises on that global rank at step 2.

Every process prints one JSON line: what the Trainer saw, and, when it trained across
processes, an all-reduce of ``rank + 1`` and whether every rank's weights agree.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.training_args import ParallelMode


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class FailAt(TrainerCallback):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2 and int(os.environ.get("RANK", "0")) == self.rank:
            raise RuntimeError(f"Trainer rank {self.rank} failed on purpose")


def verified(args: TrainingArguments, model: torch.nn.Module) -> dict:
    """An all-reduce and a weights check, only when the Trainer says it is distributed: a
    collective here would otherwise make independent processes look like one job."""
    if args.parallel_mode != ParallelMode.DISTRIBUTED:
        return {}
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    first = flat.clone()
    dist.broadcast(first, 0)
    agree = torch.tensor([float(torch.allclose(flat, first))])
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    return {"sum": total.item(), "weights_agree": bool(agree.item())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--use-cpu", action="store_true")
    parser.add_argument("--fail", type=int, default=-1)
    opts = parser.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir="trainer-out",
        per_device_train_batch_size=4,
        max_steps=4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=opts.use_cpu,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[FailAt(opts.fail)])
    trainer.train()
    record = {
        "trainer": True,
        "rank": int(os.environ.get("RANK", "-1")),
        "world_size": args.world_size,
        "parallel_mode": str(args.parallel_mode),
        "steps": trainer.state.global_step,
        **verified(args, trainer.model),
    }
    sys.stdout.write(json.dumps(record) + "\n")  # one write: whole lines in the node's pipe
    sys.stdout.flush()


if __name__ == "__main__":
    main()
