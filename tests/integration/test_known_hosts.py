"""Host keys and inputs against real sshd hosts: a known_hosts with @cert-authority,
@revoked and unreadable lines; fingerprints as ssh-keygen shows them; new keys written
hashed into a hashed known_hosts; and launch inputs refused before any host is reached
(a NUL in an env value, an overlong or newline-ended --name), with no word of Ctrl-C
before the preflight passed.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

from launch_helpers import JOB, SSHDDP, cli_env, write_inventory

from cli_helpers import Result, sshddp
from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

Port = Callable[[], int]


def with_known_hosts(cluster: SshdCluster, tmp: Path, text: str, extra: str = "") -> Path:
    """An ssh_config like the cluster's whose known_hosts holds ``text``."""
    known = tmp / "known_hosts"
    known.write_text(text)
    config = tmp / "ssh_config"
    config.write_text(
        cluster.ssh_config.read_text().replace(str(cluster.known_hosts), str(known)) + extra
    )
    return config


def doctor(cluster: SshdCluster, tmp: Path, port: int, config: Path, *opts: str) -> Result:
    inv = tmp / "inv.yaml"
    inv.write_text(cluster.inventory_yaml([1, 2], rdzv_port=port, nproc=1))
    return sshddp(["doctor", "--ssh-config", config, "--connect-timeout", "5", *opts, inv])


def keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30
    )
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


def host_pub(cluster: SshdCluster, i: int) -> str:
    pub = cluster.host_key(i).with_name(cluster.host_key(i).name + ".pub")
    return " ".join(pub.read_text().split()[:2])


def ssh_keygen_fingerprint(cluster: SshdCluster, i: int) -> str:
    pub = cluster.host_key(i).with_name(cluster.host_key(i).name + ".pub")
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()[1]


def test_cert_authority_revoked_and_unreadable_lines_break_no_host(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    ca = keygen(tmp_path / "ca")
    other = keygen(tmp_path / "other")
    text = (
        f"@cert-authority *.example.com {ca}\n"
        "this line is not a host key\n"
        "|1|bad|hash ssh-ed25519 !!!notbase64!!!\n"
        + cluster.known_hosts.read_text()
        + f"@revoked * {other}\n"
    )
    config = with_known_hosts(cluster, tmp_path, text)
    result = doctor(cluster, tmp_path, free_port(), config)
    assert result.code == ExitCode.OK, result.explain()


def test_a_revoked_host_key_is_refused_even_with_accept_new(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    h2 = cluster.host(2)
    text = cluster.known_hosts.read_text() + f"@revoked * {host_pub(cluster, 2)}\n"
    config = with_known_hosts(cluster, tmp_path, text)
    for opts in ((), ("--accept-new-host-keys",)):
        result = doctor(cluster, tmp_path, free_port(), config, *opts)
        assert result.code == ExitCode.CHECK_FAILED, result.explain()
        fingerprint = ssh_keygen_fingerprint(cluster, 2)
        assert f"host key {fingerprint} of [{h2.addr}]:{h2.port} is marked @revoked" in result.out
        assert "FAIL h1" not in result.out, result.out
    assert (tmp_path / "known_hosts").read_text() == text  # nothing was added


def test_fingerprints_are_sha256_as_ssh_keygen_shows_them(
    make_cluster: Callable[..., SshdCluster], tmp_path: Path, free_port: Port
) -> None:
    cluster = make_cluster(2)
    config, _ = cluster.config_without_known_host(2)
    unknown = doctor(cluster, tmp_path, free_port(), config)
    assert f"unknown host key {ssh_keygen_fingerprint(cluster, 2)} for" in unknown.out
    known_fp = ssh_keygen_fingerprint(cluster, 2)
    cluster.change_host_key(2)
    changed = doctor(cluster, tmp_path, free_port(), cluster.ssh_config)
    assert changed.code == ExitCode.CHECK_FAILED, changed.explain()
    new_fp = ssh_keygen_fingerprint(cluster, 2)
    assert f"CHANGED: it is now ssh-ed25519 {new_fp}, known_hosts has {known_fp}" in changed.out


def test_accept_new_writes_hashed_names_into_a_hashed_known_hosts(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    h2 = cluster.host(2)
    hash_config = "\nHost *\n    HashKnownHosts yes\n"
    for case, extra in (("hashed-file", ""), ("HashKnownHosts", hash_config)):
        work = tmp_path / case
        work.mkdir()
        _, without_h2 = cluster.config_without_known_host(2)
        config = with_known_hosts(cluster, work, without_h2.read_text(), extra)
        known = work / "known_hosts"
        if case == "hashed-file":
            subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True)
            assert known.read_text().startswith("|1|")
        accepted = doctor(cluster, work, free_port(), config, "--accept-new-host-keys")
        assert accepted.code == ExitCode.OK, accepted.explain()
        added = known.read_text().splitlines()[-1]
        assert added.startswith("|1|") and f"{h2.addr}" not in added, added
        found = subprocess.run(
            ["ssh-keygen", "-F", f"[{h2.addr}]:{h2.port}", "-f", str(known)],
            capture_output=True,
            text=True,
        )
        assert host_pub(cluster, 2).split()[1] in found.stdout, found.stdout
        again = doctor(cluster, work, free_port(), config)  # now known, hashed
        assert again.code == ExitCode.OK, again.explain()


def test_bad_launch_inputs_are_refused_before_any_host_is_reached(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Port, run_no_leak
) -> None:
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    nul = tmp_path / "nul.yaml"
    nul.write_text(inv.read_text().replace("GLOO_SOCKET_IFNAME: lo", 'BAD: "a\\0b"'))

    def launch(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SSHDDP, "launch", *map(str, args)],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            capture_output=True,
            text=True,
            timeout=120,
        )

    cases = [
        ((nul, JOB, "ok"), "defaults.env.BAD: expected a string or a number without NUL"),
        (("--name", "n" * 300, inv, JOB, "ok"), "(300 characters): expected 1-64 letters"),
        (("--name", "trail\n", inv, JOB, "ok"), "--name 'trail\\n': expected"),
    ]
    for args, needle in cases:
        t0 = time.monotonic()
        r = launch(*args)
        assert r.returncode == ExitCode.BAD_INPUT, r.stderr
        assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert time.monotonic() - t0 < 60
        assert not (workdir / "runs").exists()  # nothing reached any host


def test_the_banner_speaks_of_ctrl_c_only_once_the_preflight_passed(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Port, run_no_leak
) -> None:
    port = free_port()
    inv, workdir = write_inventory(ssh_env, tmp_path, port, hosts=[1, 2], nproc=1)
    with socket.socket() as holder:  # the rendezvous port is taken: the preflight fails
        holder.bind(("0.0.0.0", port))
        holder.listen()
        failed = subprocess.run(
            [*SSHDDP, "launch", "--name", "nocc", str(inv), str(JOB), "ok"],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert failed.returncode == ExitCode.CHECK_FAILED, failed.stderr
    # a run id the failed preflight dropped is never named, and leaves no empty log files
    assert "sshddp: run nocc:" not in failed.stderr and "Ctrl-C" not in failed.stderr
    assert not (tmp_path / "sshddp-logs" / "nocc").exists()
    ok = subprocess.run(
        [*SSHDDP, "launch", "--name", "yescc", str(inv), str(JOB), "ok"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and "Ctrl-C stops the run on every host" in ok.stderr
    run_no_leak("yescc")
