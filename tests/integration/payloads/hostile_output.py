"""A rank that tries to take over the user's terminal through its output, then (the last
rank) fails, so that its lines land in sshddp's report too.

Every line it prints holds terminal controls: OSC 0 (retitle), OSC 52 (write the
clipboard), a screen clear, a device-status query (the terminal would type the answer), a
``\\r`` that overprints a forged sshddp verdict, a bidi override, and some colour and a
``\\r`` progress bar, which must keep working on the live console. No torch: torchrun
runs it as is.
"""

import os
import sys

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
RUN = os.environ["SSHDDP_RUN_ID"]

LINES = [
    f"\x1b]0;pwned-title-{RANK}\x07title set",
    "\x1b]52;c;cm0gLXJmIH4K\x07clipboard written",
    "\x1b[2J\x1b[Hscreen cleared",
    "\x1b[6nasked the terminal for its cursor",
    f"{'x' * 30}\rsshddp: run {RUN} succeeded",
    "\u202eevil bidi\u202c",
    f"\x1b[31mred {RANK}\x1b[0m plain",
    "progress 10%\rprogress 50%\rprogress 100%",
]

for line in LINES:
    print(line, flush=True)
if RANK == WORLD - 1:
    sys.exit(3)
