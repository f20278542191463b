"""A script written for torch.distributed.launch: it takes --local_rank from its arguments
(and imports no torch). Prints its local rank both ways, and its other arguments."""

import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("rest", nargs="*")
args = parser.parse_args()
summary = {"rank": int(os.environ["RANK"]), "local_rank": args.local_rank, "rest": args.rest}
print(json.dumps({**summary, "LOCAL_RANK": int(os.environ["LOCAL_RANK"])}), flush=True)
