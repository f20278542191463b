"""hosts.hostkeys: known_hosts read line by line (markers, junk, hashed names) and
fingerprints as ssh-keygen prints them; keys made by the real ssh-keygen."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko

from sshddp.hosts.hostkeys import KnownHosts, fingerprint


def keygen(path: Path) -> tuple[str, paramiko.PKey]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    pub = " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])
    return pub, paramiko.PKey.from_path(str(path))


def test_fingerprint_is_what_ssh_keygen_prints(tmp_path: Path) -> None:
    _, key = keygen(tmp_path / "k")
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(tmp_path / "k.pub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert fingerprint(key) == out.split()[1]


def test_markers_junk_and_revoked_keys(tmp_path: Path) -> None:
    good, good_key = keygen(tmp_path / "good")
    bad, bad_key = keygen(tmp_path / "bad")
    ca, _ = keygen(tmp_path / "ca")
    known = tmp_path / "known_hosts"
    known.write_text(
        f"@cert-authority *.corp {ca}\n"
        "# a comment\n\n"
        "not a key line\n"
        "host3 ssh-ed25519 ###notbase64###\n"
        f"host1,10.0.0.1 {good}\n"
        f"host2 {bad}\n"
        f"@revoked * {bad}\n"
        "@future-marker host9 ssh-ed25519 AAAA\n"
    )
    hosts = KnownHosts.load(known)
    assert [e.hostnames for e in hosts.entries] == [["host1", "10.0.0.1"]]
    assert hosts.revoked == {bad_key.asbytes()} and not hosts.hashed
    client = paramiko.SSHClient()
    hosts.install(client)
    assert client.get_host_keys().lookup("10.0.0.1") is not None
    assert client.get_host_keys().lookup("host2") is None  # revoked: never trusted
    assert KnownHosts.load(tmp_path / "missing").entries == []
    assert good_key.asbytes() not in hosts.revoked


def test_a_hashed_file_is_seen_as_hashed(tmp_path: Path) -> None:
    good, _ = keygen(tmp_path / "good")
    known = tmp_path / "known_hosts"
    known.write_text(f"[10.0.0.7]:2222 {good}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True)
    hosts = KnownHosts.load(known)
    assert hosts.hashed
    client = paramiko.SSHClient()
    hosts.install(client)
    assert client.get_host_keys().lookup("[10.0.0.7]:2222") is not None
