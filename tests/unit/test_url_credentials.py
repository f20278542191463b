"""The credentials inside a URL never reach the screen or the trace, whatever the variable
is called: ``envvars.hide_url_credentials``, and ``launch --dry-run`` and the trace using it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cli_helpers import sshddp
from sshddp import trace
from sshddp.errors import ExitCode
from sshddp.model.envvars import hide_url_credentials, masked


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://alice:PassW0rd@idx.example/simple", "http://***@idx.example/simple"),
        ("https://alice:pw@idx.example:8443/simple/", "https://***@idx.example:8443/simple/"),
        ("http://u:p@[::1]:8080/x", "http://***@[::1]:8080/x"),
        ("http://u:p@[fe80::1%25eth0]/", "http://***@[fe80::1%25eth0]/"),
        ("https://ghp_t0ken@github.com/o/r.git", "https://***@github.com/o/r.git"),
        ("redis://:pw@db:6379/0", "redis://***@db:6379/0"),
        ("git+ssh://git@host/r", "git+ssh://***@host/r"),
        ("http://a:p@ss@h/x", "http://***@h/x"),  # an unescaped "@" in the password
        ("http://a:b%40c@h", "http://***@h"),
        # several URLs in one value, whatever separates them
        ("http://a:b@h1/x https://c:d@h2/y", "http://***@h1/x https://***@h2/y"),
        ("http://a:b@h1,http://c:d@h2", "http://***@h1,http://***@h2"),
        ("x=http://a:b@h1;y=ftp://c:d@h2", "x=http://***@h1;y=ftp://***@h2"),
    ],
)
def test_the_userinfo_of_every_url_is_hidden(text: str, shown: str) -> None:
    assert hide_url_credentials(text) == shown
    assert hide_url_credentials(shown) == shown  # shown twice, the same


@pytest.mark.parametrize(
    "text",
    [
        "user@host",  # an SSH target is not a URL
        "git@github.com:org/repo.git",
        "ssh -J jump@bastion alice@node1",
        "bob@example.com",
        "http://host:8080/simple",
        "http://[::1]:8080/",
        "http://host/path/a@b",  # an "@" past the authority
        "http://host/p?email=a@b.c",
        "http://host#frag@x",
        "file:///home/me/a@b",
        "eth0,^docker0",
        "",
    ],
)
def test_text_without_url_credentials_is_left_as_it_is(text: str) -> None:
    assert hide_url_credentials(text) == text


def test_masked_hides_url_credentials_in_any_variable() -> None:
    env = {"UV_INDEX_URL": "http://alice:pw@idx/simple", "HF_TOKEN": "hf_x", "LR": "0.1"}
    assert masked(env, frozenset({"HF_TOKEN"})) == {
        "UV_INDEX_URL": "http://***@idx/simple",
        "HF_TOKEN": "***",
        "LR": "0.1",
    }


def test_the_trace_formatter_hides_url_credentials() -> None:
    formatter = trace.Formatter(start=0.0, clock=lambda: 0.0, redact=hide_url_credentials)
    message = "stage node 0 (h1): failed: fetch http://alice:pw@idx/simple: 401"
    record = logging.LogRecord("sshddp", logging.INFO, "", 0, "%s", (message,), None)
    assert formatter.format(record) == (
        "sshddp[+0.000s] stage node 0 (h1): failed: fetch http://***@idx/simple: 401"
    )


def test_launch_dry_run_shows_no_url_credentials(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "hosts:\n  - host: gpu-a\n    env:\n"
        "      UV_INDEX_URL: http://alice:PassW0rd@idx.example:8080/simple\n"
        "      PIP_EXTRA_INDEX_URL: 'https://bob:S3cr3t@[fd00::1]/a https://carol:Pw@m.example/b'\n"
    )
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = sshddp(
        ["launch", "--dry-run", "-v", str(inv), str(script), "--data", "s3://k:Secr3t@bucket/x"]
    )
    assert result.code == ExitCode.OK, result.explain()
    for secret in ("PassW0rd", "S3cr3t", "carol:Pw", "Secr3t"):
        assert secret not in result.text, secret
    assert "UV_INDEX_URL='http://***@idx.example:8080/simple'" in result.out, result.explain()
    assert "https://***@[fd00::1]/a https://***@m.example/b" in result.out, result.explain()
    assert "--data 's3://***@bucket/x'" in result.out, result.explain()
