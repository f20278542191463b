"""`sshddp stacks` in-process on runs that cannot give stacks: clean messages and the
documented exit codes (2 bad input, 4 unreachable), never a traceback. The unreachable node
is a closed port on loopback."""

from __future__ import annotations

import sys
from pathlib import Path

from cli_helpers import assert_clean_failure, sshddp
from sshddp.errors import ExitCode
from sshddp.model.inventory import Host
from stacks_records import local, record


def test_unknown_run_and_node_out_of_range_are_bad_input(tmp_path: Path) -> None:
    record(tmp_path, local(0))
    missing = sshddp(["stacks", "nosuch"])
    assert_clean_failure(missing, ExitCode.BAD_INPUT)
    assert "no run 'nosuch'" in missing.err
    node = sshddp(["stacks", "r1", "--node", "1"])
    assert_clean_failure(node, ExitCode.BAD_INPUT)
    assert "run r1 has nodes 0-0" in node.err


def test_no_reachable_node_is_unreachable(tmp_path: Path) -> None:
    record(tmp_path, Host("127.0.0.1", 0, port=1, python=sys.executable))
    result = sshddp(["stacks", "r1", "--connect-timeout", "5"])
    assert_clean_failure(result, ExitCode.UNREACHABLE)
    assert result.err.startswith("sshddp: error: no stacks: node 0 (127.0.0.1): "), result.err
