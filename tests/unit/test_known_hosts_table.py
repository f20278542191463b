"""hosts.hostkeys: a connection given only the known_hosts entries that name its host
trusts what it would have trusted given all of them (plain, listed, hashed, ``[addr]:port``,
repeated, revoked names), and a command's connections share one parse of the file."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from paramiko.hostkeys import HostKeys

from sshddp.hosts.hostkeys import KnownHosts, read_known_hosts

NAMES = ["host1", "10.0.0.1", "[10.0.0.7]:2222", "10.0.0.7", "dup", "hashed1", "revoked",
         "*.corp", "a.corp", "nowhere", "|1|x|y"]  # fmt: off


def pub() -> str:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    msg = paramiko.Message()
    msg.add_string("ssh-ed25519")
    msg.add_string(raw)
    return "ssh-ed25519 " + base64.b64encode(msg.asbytes()).decode()


def tricky(path: Path) -> None:
    k = [pub() for _ in range(8)]
    path.write_text(
        f"host1,10.0.0.1 {k[0]}\n"
        f"[10.0.0.7]:2222 {k[1]}\n"
        f"dup {k[2]}\n"
        f"dup {k[3]}\n"  # the same name and type again: the later key replaces the first
        f"{HostKeys.hash_host('hashed1')} {k[4]}\n"
        f"{HostKeys.hash_host('dup')} {k[5]}\n"
        f"revoked {k[6]}\n"
        f"@revoked * {k[6]}\n"
        f"*.corp {k[7]}\n"
        f"@cert-authority *.corp {k[7]}\n"
        "|1|notbase64|notbase64 ssh-ed25519 AAAA\n"
        "# a comment\n\njunk\n"
    )


def trusted(known: KnownHosts, name: str, only: bool) -> dict[str, bytes] | None:
    client = paramiko.SSHClient()
    known.install(client, name if only else None)
    found = client.get_host_keys().lookup(name)
    return None if found is None else {t: found[t].asbytes() for t in found}


@pytest.mark.parametrize("name", NAMES)
def test_its_own_entries_trust_what_all_of_them_do(tmp_path: Path, name: str) -> None:
    tricky(tmp_path / "known_hosts")
    known = KnownHosts.load(tmp_path / "known_hosts")
    assert trusted(known, name, only=True) == trusted(known, name, only=False)


def test_a_host_gets_only_its_own_entries(tmp_path: Path) -> None:
    tricky(tmp_path / "known_hosts")
    known = KnownHosts.load(tmp_path / "known_hosts")
    client = paramiko.SSHClient()
    known.install(client, "dup")
    assert len(client.get_host_keys()._entries) == 2  # plain (last key wins) and hashed
    assert [name for name, _ in known.naming("dup")][0] == "dup"


def test_one_parse_until_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    tricky(path)
    first = read_known_hosts(path)
    assert read_known_hosts(path) is first
    path.write_bytes(path.read_bytes())  # rewritten, the same bytes: the same parse
    assert read_known_hosts(path) is first
    with open(path, "a") as fh:
        fh.write(f"newhost {pub()}\n")
    again = read_known_hosts(path)
    assert again is not first and again.naming("newhost")
    # the same size and inode, within the clock's tick (a key replaced by one as long)
    text = path.read_text()
    mtime = os.stat(path).st_mtime_ns
    path.write_text(text.replace("newhost", "oldhost"))
    os.utime(path, ns=(mtime, mtime))
    third = read_known_hosts(path)
    assert third.naming("oldhost") and not third.naming("newhost")
    missing = tmp_path / "missing"
    assert read_known_hosts(missing).entries == []
    missing.write_text(f"late {pub()}\n")
    assert read_known_hosts(missing).naming("late")
