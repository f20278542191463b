"""Hypothesis strategies for hostile argv and environment values, shared by the unit and
integration tests that check they reach the remote processes unchanged.

What a value may be, and why:

* **argv values** are any text without NUL, a POSIX argv cannot hold NUL. They can be
  empty, hold spaces, quotes, ``$(...)``, backticks, ``;``, newlines and non-ASCII text,
  or start with dashes. A POSIX argv is bytes, so a value can also be bytes that are not
  UTF-8. Python holds those as lone surrogates U+DC80..U+DCFF (``os.fsdecode``'s
  ``surrogateescape``), so the strategies make them by decoding arbitrary bytes. Any
  other lone surrogate is left out: no POSIX argv or environment can carry it, because
  ``os.fsencode`` refuses it, so no user can pass one.
* **env values from ``--env``** are argv values too (or the local environment, the same
  bytes).
* **env values from the inventory** are YAML text, so they cannot hold surrogates at all.
* **env names** follow the inventory's rule ``[A-Za-z_][A-Za-z0-9_]*``, apart from the
  names the supervisor sets itself (``RESERVED``).
"""

from __future__ import annotations

import os

from hypothesis import strategies as st

RESERVED = frozenset({"SSHDDP_RUN_ID", "SSHDDP_NODE_RANK", "SSHDDP_NODE_MARK", "NODE_RANK"})

# The cases most likely to break quoting, parsing or templating, drawn often.
NASTY = (
    "",
    " ",
    "a b",
    "it's",
    '"dq"',
    "'",
    '"',
    "\\",
    "\\'",
    "$(touch /tmp/pwned)",
    "`id`",
    "x; rm -rf ~",
    "a && b",
    "l1\nl2",
    "\n",
    "\r\n",
    "\t",
    "ünïcødé ✓",
    "日本語",
    "🚀",
    "--",
    "-",
    "-m",
    "--lr",
    "--lr=0.1",
    "--log",  # a prefix of several of torchrun's options: "ambiguous option" before "--"
    "--l",
    "--nnodes=9",
    "--no-python",
    "-c",
    "@args.txt",
    "*",
    "~",
    "~root",
    "$HOME",
    "${HOME}",
    "$$",
    "$",
    "$local_rank",
    "${local_rank}",
    "$${local_rank}",
    "%s",
    "{}",
    "#",
    "!",
    "\x1b[31m",
    "\x7f",
    "\u2028",
    "\ufeff",
    "\udc80\udcff",  # bytes 0x80 0xff: not UTF-8
)

_TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
_NOT_UTF8 = st.binary(max_size=8).filter(lambda b: b"\x00" not in b).map(os.fsdecode)


def has_surrogate(value: str) -> bool:
    """Whether ``value`` holds bytes that are not UTF-8 (or any other lone surrogate)."""
    return any("\ud800" <= c <= "\udfff" for c in value)


#: One argv value, as a POSIX argv can hold it.
argv_values = st.one_of(st.sampled_from(NASTY), st.text(_TEXT, max_size=24), _NOT_UTF8)
#: One environment value as YAML text can hold it (no surrogates).
yaml_values = st.one_of(
    st.sampled_from([v for v in NASTY if not has_surrogate(v)]), st.text(_TEXT, max_size=24)
)
#: An environment name the inventory and ``--env`` accept.
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda name: name not in RESERVED
)
