"""hosts.sshconfig: an ssh_config's stanzas indexed once answer every lookup as paramiko's
own pass over all of them does (Host lists, wildcards, negation, character classes, Match,
accumulated IdentityFile), and consider only the stanzas that can apply."""

from __future__ import annotations

import io
from pathlib import Path

import paramiko
import pytest

from sshddp.hosts import ssh
from sshddp.hosts.sshconfig import IndexedSshConfig

TRICKY = """\
Host h1 h2 shared
    HostName 10.0.0.1
    IdentityFile ~/.ssh/one
Host h2
    Port 2202
    IdentityFile ~/.ssh/two
Host *.corp !bad.corp
    User corpuser
    IdentityFile ~/.ssh/corp
Host h? !h3
    ConnectTimeout 7
Host [xy]z
    Port 2299
Match host 10.0.0.1
    User matched-by-hostname
Match originalhost shared
    ForwardAgent yes
Match user nobody-at-all
    Port 1
Match final host h4
    ServerAliveInterval 9
Match canonical all
    LogLevel QUIET
Host h1
    Port 2201
Host 127.0.0.5
    User byaddress
Host *
    User fallback
    Port 22
"""

NAMES = [
    "h1", "h2", "h3", "h4", "h10", "shared", "a.corp", "bad.corp", "xz", "yz", "zz",
    "127.0.0.5", "127.0.0.50", "unknown", "H1", "h1 ",
]  # fmt: off


def parsed(text: str) -> paramiko.SSHConfig:
    config = paramiko.SSHConfig()
    config.parse(io.StringIO(text))
    return config


@pytest.mark.parametrize("name", NAMES)
def test_same_answer_as_paramiko_on_a_tricky_config(name: str) -> None:
    plain = parsed(TRICKY)
    assert dict(IndexedSshConfig.of(plain).lookup(name)) == dict(plain.lookup(name))


def test_a_generated_cluster_config_answers_alike_and_tries_few_stanzas() -> None:
    blocks = [
        f"Host h{i}\n    HostName 127.1.{i // 200}.{i % 200}\n    Port 22\n" for i in range(256)
    ]
    text = "".join(blocks) + "Host h1*\n    User tens\nHost *\n    User everyone\n"
    plain = parsed(text)
    index = IndexedSshConfig.of(plain)
    for i in range(256):
        assert dict(index.lookup(f"h{i}")) == dict(plain.lookup(f"h{i}"))
    # its own stanza, h1*, * and paramiko's leading global one: not the 255 others
    assert len(index.candidates("h17")) == 4


def test_ssh_config_of_a_command_is_the_index(tmp_path: Path) -> None:
    path = tmp_path / "ssh_config"
    path.write_text(TRICKY)
    ssh._ssh_config.cache_clear()
    try:
        config = ssh._ssh_config(str(path))
        assert isinstance(config, IndexedSshConfig)
        for name in NAMES:
            assert dict(config.lookup(name)) == dict(parsed(TRICKY).lookup(name))
    finally:
        ssh._ssh_config.cache_clear()
