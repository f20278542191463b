"""``sshddp exec``'s command on this host, in the environment a node launcher's has.

args: {"argv": the command and its arguments, "env": the inventory's variables for this
host}. The command replaces this interpreter (``execvpe``) with ``env`` added, this
interpreter's directory first on ``PATH`` (``common.python_first``, as ``--launcher node``
does) and stderr joined to stdout. The values come over stdin, never in an argv. A command
that cannot start says why on stdout and exits 127 (not found) or 126, as a shell does.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from sshddp.remote.common import python_first


def main(args: dict[str, Any]) -> None:
    argv = [str(a) for a in args["argv"]]
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (args.get("env") or {}).items()})
    env["PATH"] = python_first(env.get("PATH"))
    sys.stdout.flush()
    os.dup2(1, 2)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        missing = exc.errno == errno.ENOENT
        os.write(1, f"sshddp exec: {argv[0]}: {exc.strerror}\n".encode("utf-8", "replace"))
        os._exit(127 if missing else 126)
