"""The host side of ``doctor --health`` (remote/calls/host_health.py): the kernel log's
records and the InfiniBand ports read from a sysfs tree in its real layout (the commands
it runs: tests/integration/test_remote_health_commands.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sshddp.remote.calls import host_health


def test_a_kernel_log_record_reads_as_dmesg_shows_it() -> None:
    record = (
        b"3,1201,812442139,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, name=python, "
        b"GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    )
    assert host_health._kmsg_line(record) == (
        "[812.442139] NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, name=python, "
        "GPU has fallen off the bus."
    )


def test_infiniband_ports_from_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for dev, state, phys, downed in (
        ("mlx5_0", "4: ACTIVE", "5: LinkUp", "0"),
        ("mlx5_1", "1: DOWN", "3: Disabled", "7"),
    ):
        port = tmp_path / dev / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text(phys + "\n")
        (port / "link_layer").write_text("InfiniBand\n")
        (port / "counters" / "link_downed").write_text(downed + "\n")
    monkeypatch.setattr(host_health, "IB", str(tmp_path))
    first = host_health.ib_ports()
    (tmp_path / "mlx5_1" / "ports" / "1" / "counters" / "link_downed").write_text("9\n")
    again = host_health._ib_again(first)
    assert again == [
        {
            "dev": "mlx5_0",
            "port": "1",
            "state": "4: ACTIVE",
            "phys_state": "5: LinkUp",
            "link_layer": "InfiniBand",
            "link_downed": 0,
            "link_downed_before": 0,
        },
        {
            "dev": "mlx5_1",
            "port": "1",
            "state": "1: DOWN",
            "phys_state": "3: Disabled",
            "link_layer": "InfiniBand",
            "link_downed": 9,
            "link_downed_before": 7,
        },
    ]
