"""Inventory files -> a frozen ``Inventory`` of ``Host``s.

Owns the two inventory formats (YAML, and a DeepSpeed/MPI-style hostfile) and every check
on them. An error names the file, line, key path, bad value and expected form, then shows
the offending line with a caret, so a typo is fixed without guessing. Nothing but
``InventoryError`` leaves ``load_inventory`` / ``parse_inventory``, whatever the input.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Optional

from sshddp import defaults
from sshddp.errors import InventoryError
from sshddp.model import envvars
from sshddp.model.share import share_problem


class _YamlOnUse:
    """PyYAML, imported the first time an attribute is asked for: a launch into a Slurm
    allocation or onto ``-H`` hosts reads no YAML, and importing PyYAML (its reader's and
    resolver's patterns) is ~15 ms of the coordinator's start (docs/performance.md)."""

    def __getattr__(self, name: str) -> Any:
        import yaml

        value = getattr(yaml, name)
        setattr(self, name, value)  # the next use is a plain attribute, on the parse path
        return value


if TYPE_CHECKING:
    import yaml
else:
    yaml = _YamlOnUse()

__all__ = [
    "Format",
    "Host",
    "Inventory",
    "Rendezvous",
    "SlurmRequest",
    "Transport",
    "format_of",
    "parse_inventory",
    "with_spare_list",
]

Format = Literal["auto", "yaml", "hostfile"]
Transport = Literal["ssh", "srun"]
TRANSPORTS: tuple[Transport, ...] = ("ssh", "srun")

_SHOW_WIDTH = 60
_SNIPPET_WIDTH = 120


def _frozen_env(env: Optional[Mapping[str, str]] = None) -> Mapping[str, str]:
    return MappingProxyType(dict(env or {}))


@dataclass(frozen=True)
class Host:
    """One inventory host: how to reach it and how many processes it runs."""

    host: str  #: ssh_config alias, hostname or IP address, as written
    index: int  #: position in the inventory (0-based), which is the node rank
    user: Optional[str] = None  #: ssh user; None = ssh_config / the local user
    port: Optional[int] = None  #: ssh port; None = ssh_config / 22
    gpus: Optional[int] = None  #: GPUs expected on the host and used
    nproc: Optional[int] = None  #: processes for a CPU host
    python: str = defaults.PYTHON  #: interpreter with torch on the host
    addr: Optional[str] = None  #: address the other nodes use to reach it
    #: defaults.env merged with the host's env (read-only); excluded from hash as a dict is
    env: Mapping[str, str] = field(default_factory=_frozen_env, hash=False)
    workdir: str = defaults.WORKDIR  #: remote base directory for sshddp's files
    #: the user's own health check: a shell command run on the host (``doctor --health``)
    health: Optional[str] = None
    line: int = 0  #: 1-based line of the host's entry in the file (0 if unknown)
    transport: Transport = "ssh"  #: how sshddp reaches it: SSH, or a Slurm job step (srun)
    slurm_job: Optional[str] = None  #: the Slurm job whose node this is (hosts: {slurm: ...})
    #: line of `gpus:` under `defaults:` where the host takes its gpus from there, else 0
    gpus_defaults_line: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        # A caller's dict must not change a frozen Host behind its back.
        object.__setattr__(self, "env", _frozen_env(self.env))

    @property
    def is_local(self) -> bool:
        """True for ``localhost``, which runs without SSH."""
        return self.host == "localhost"

    @property
    def procs(self) -> int:
        """Processes on this node: the GPUs if any, else ``nproc`` if set and > 0, else 1."""
        if self.gpus:
            return self.gpus
        return self.nproc if self.nproc else 1


@dataclass(frozen=True)
class Rendezvous:
    """Where torchrun's c10d rendezvous listens."""

    port: int = defaults.RDZV_PORT  #: TCP port of the rendezvous; AUTO_PORT: `port: auto`
    host: Optional[str] = None  #: address of the rendezvous; None = the first host's addr


@dataclass(frozen=True)
class SlurmRequest:
    """``hosts: {slurm: JOB}``: the hosts are a Slurm job's nodes, known only once asked."""

    job: str  #: a job id, or "current" (the allocation sshddp runs in)
    source: str  #: where it was asked for: the file, or the command line's ``slurm:JOB``
    line: int = 0  #: line of ``slurm:`` in the file (0: the command line)
    defaults: Mapping[str, Any] = field(default_factory=_frozen_env, hash=False)  #: defaults:


@dataclass(frozen=True)
class Inventory:
    """A validated inventory: hosts in node-rank order and the rendezvous."""

    source: str  #: path of the file, or "<string>"
    hosts: tuple[Host, ...]  #: hosts[i].index == i; at least one, once ``slurm`` is resolved
    rendezvous: Rendezvous  #: rendezvous settings (defaults if the file has none)
    slurm: Optional[SlurmRequest] = None  #: the hosts are this Slurm job's nodes
    share: tuple[str, ...] = ()  #: ``defaults.share``: paths handed on from node 0 (--share)
    #: ``defaults.sync``: the uv project every launch syncs first (--sync), as written
    sync: Optional[str] = None
    include: tuple[str, ...] = ()  #: ``defaults.include``: ignored --workdir files sent (--include)
    #: ``spares:`` (or --spares): hosts that take a bad host's node rank at launch; a spare's
    #: ``index`` is its place in that list, not a node rank
    spares: tuple[Host, ...] = ()
    #: ``min_nodes:``: the fewest nodes a run goes on with once a node is lost and no spare
    #: is left (``--max-restarts``); 0: a lost node with no spare ends the run
    min_nodes: int = 0


# --- public entry points -------------------------------------------------------------------


def parse_inventory(text: str, source: str = "<string>", *, fmt: Format = "auto") -> Inventory:
    """Validate inventory ``text``; ``source`` names it in errors.

    ``fmt="auto"`` reads YAML when the text is a YAML mapping, else a hostfile.
    """
    doc = _Doc.of(text, source)
    if fmt == "hostfile":
        return _parse_hostfile(doc)
    if fmt == "yaml":
        return _parse_yaml(doc, _require_mapping(doc, _compose(doc)))
    if fmt != "auto":
        raise ValueError(f"unknown inventory format {fmt!r}")
    return _parse_auto(doc)


def format_of(name: str) -> Format:
    """The inventory format a file name says (``auto``: look at the text)."""
    base = os.path.basename(name).lower()
    suffix = os.path.splitext(base)[1]
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix in (".txt", ".hosts", ".hostfile") or base == "hostfile":
        return "hostfile"
    return "auto"


# --- error reporting -----------------------------------------------------------------------

# The line breaks PyYAML counts, so its marks and our line numbers agree.
_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


@dataclass(frozen=True)
class _Where:
    """A place in the source: key path, 1-based line (0 = unknown), 0-based column."""

    path: str
    line: int = 0
    col: int = 0


@dataclass(frozen=True)
class _Doc:
    """The text being parsed; turns a problem at a place into an ``InventoryError``."""

    source: str
    text: str
    lines: tuple[str, ...]

    @classmethod
    def of(cls, text: str, source: str) -> _Doc:
        return cls(source, text, tuple(_LINE_BREAK.split(text)))

    def fail(self, where: _Where, message: str) -> NoReturn:
        raise InventoryError(self.format(where, message))

    def format(self, where: _Where, message: str) -> str:
        head = f"{self.source}:{where.line}" if where.line else self.source
        label = f"{where.path}: " if where.path else ""
        paragraph = _LINE_BREAK.sub(" ", f"{head}: {label}{message}")
        if not 0 < where.line <= len(self.lines):
            return paragraph
        return f"{paragraph}\n{_snippet(self.lines[where.line - 1], where.line, where.col)}"


def _snippet(text: str, number: int, col: int) -> str:
    """The source line and a caret under ``col``, like httpie's nested_json errors."""
    text = "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in text)
    if len(text) > _SNIPPET_WIDTH:
        start = max(0, min(col - _SNIPPET_WIDTH // 2, len(text) - _SNIPPET_WIDTH))
        text, col = text[start : start + _SNIPPET_WIDTH], col - start
    # Keep tabs so the caret lines up however the terminal expands them.
    pad = "".join("\t" if ch == "\t" else " " for ch in text[:col])
    pad += " " * max(0, col - len(text))
    width = max(5, len(str(number)))
    return f"{number:>{width}} | {text}\n{'':>{width}} | {pad}^"


def _show(value: object) -> str:
    """The value's repr, cut to about 60 characters (keeping a string's closing quote)."""
    shown = repr(value)
    if len(shown) <= _SHOW_WIDTH:
        return shown
    if isinstance(value, str):
        cut = repr(value[: _SHOW_WIDTH - 5])
        return f"{cut[:-1]}...{cut[-1]}"
    return shown[: _SHOW_WIDTH - 3] + "..."


def _join(path: str, key: str) -> str:
    name = key if re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", key) else _show(key)
    return f"{path}.{name}" if path else name


def _unknown_key(
    doc: _Doc, where: _Where, name: str, known: tuple[str, ...], hints: Mapping[str, str]
) -> NoReturn:
    hint = hints.get(name)
    if hint is None:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else ""
    unknown = f"unknown key {_show(name)}; {hint}" if hint else f"unknown key {_show(name)}."
    doc.fail(where, f"{unknown} Known keys: {', '.join(known)}.")


# --- the checks on every scalar key --------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    """How one scalar key is checked."""

    expected: str  #: the accepted form, for error messages
    check: Callable[[Any], bool]  #: True when the value is acceptable
    text: bool  #: a name: taken as written, not as YAML would type it (8, 1:30, a date)


def _matches(pattern: str) -> Callable[[Any], bool]:
    compiled = re.compile(pattern)
    return lambda value: isinstance(value, str) and compiled.fullmatch(value) is not None


# bool is an int subclass, and YAML reads `yes` as True: neither is a count or a port.
def _is_count(value: object) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and 0 <= value <= defaults.MAX_PROCS_PER_NODE
    )


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


_is_workdir_text = _matches(r"~|(?:~/|/)[A-Za-z0-9_.+@%,:=/-]*")


def _is_workdir(value: object) -> bool:
    # Unquoted on the remote shell so that ~ expands, hence no shell syntax at all.
    return _is_workdir_text(value) and ".." not in str(value).split("/")


def _is_health_command(value: object) -> bool:
    # One line: the finding quotes it, and the host runs it with `sh -c`.
    return (
        isinstance(value, str)
        and bool(value.strip())
        and len(value) <= 1000
        and not any(c in value for c in "\0\n\r")
    )


# Host names reach ssh and shell command lines: no option-like or shell-active text.
_HOST_RULE = _Rule(
    "a host name, ssh alias or IP address (letters, digits and . _ - : % [ ], not starting "
    "with '-' or ending with ':')",
    _matches(r"(?!-)[A-Za-z0-9_.:%\[\]-]{1,253}(?<!:)"),
    text=True,
)
_COUNT_RULE = _Rule(
    f"a non-negative integer up to {defaults.MAX_PROCS_PER_NODE}", _is_count, text=False
)
_RULES: dict[str, _Rule] = {
    "host": _HOST_RULE,
    "user": _Rule(
        "a user name (letters, digits and _ . -, starting with a letter or '_')",
        _matches(r"[A-Za-z_][A-Za-z0-9_.-]*"),
        text=True,
    ),
    "port": _Rule("an integer port from 1 to 65535", _is_port, text=False),
    "gpus": _COUNT_RULE,
    "nproc": _COUNT_RULE,
    "python": _Rule(
        "an interpreter path or command without spaces or shell characters (letters, digits "
        "and _ . / ~ + -)",
        _matches(r"(?!-)[A-Za-z0-9_./~+-]+"),
        text=True,
    ),
    "addr": _HOST_RULE,
    "workdir": _Rule(
        "an absolute path or one starting with '~/' (letters, digits and _ . + @ % , : = / -; "
        "no '..')",
        _is_workdir,
        text=True,
    ),
    "sync": _Rule(
        "the path of a uv project directory (pyproject.toml and uv.lock), relative to the "
        "inventory's directory or absolute",
        lambda v: isinstance(v, str) and bool(v.strip()) and "\0" not in v,
        text=True,
    ),
    "health": _Rule(
        "a shell command on one line (at most 1000 characters), run on the host by "
        "`doctor --health`; a non-zero exit makes the host unhealthy",
        _is_health_command,
        text=True,
    ),
    "transport": _Rule(
        "ssh or srun (srun needs hosts: {slurm: ...})", lambda v: v in TRANSPORTS, text=True
    ),
}
# `rendezvous: {port: auto}`: the preflight picks a free pair on the first host.
_AUTO_PORT = defaults.AUTO_PORT
_RDZV_PORT_RULE = _Rule(
    "an integer port from 1 to 65535, or auto",
    lambda value: value == "auto" or _is_port(value),
    text=False,
)
_SLURM_RULE = _Rule(
    "a Slurm job id (digits, or 123_4 for an array task) or 'current' (the allocation "
    "sshddp runs in)",
    _matches(r"current|[0-9]{1,10}(?:_[0-9]{1,10})?"),
    text=True,
)
_ENV_NAME_RULE = _Rule(
    "an environment variable name (letters, digits and '_', not starting with a digit)",
    _matches(r"[A-Za-z_][A-Za-z0-9_]*"),
    text=True,
)
_ENV_VALUE_RULE = _Rule(
    "a string or a number without NUL characters (no environment variable can hold one)",
    lambda value: isinstance(value, str) and envvars.can_hold(value),
    text=True,
)

_HOST_KEYS = (
    "host",
    "user",
    "port",
    "gpus",
    "nproc",
    "python",
    "addr",
    "env",
    "workdir",
    "health",
)
_RUN_KEYS = ("transport", "share", "sync", "include")  #: under defaults, but the run's
_DEFAULT_KEYS = (*(key for key in _HOST_KEYS if key != "host"), *_RUN_KEYS)
_TOP_KEYS = ("defaults", "rendezvous", "hosts", "spares", "min_nodes")
#: the top-level keys a Slurm job's inventory refuses, and why
_SLURM_REFUSES = MappingProxyType(
    {"spares": "are host names", "min_nodes": "counts the hosts listed by name"}
)
_RDZV_KEYS = ("port", "host")
_HOSTFILE_KEYS = (
    "slots",
    *(key for key in _RULES if key not in ("host", "transport", "sync", "health")),
)

_YAML_HINTS = MappingProxyType(
    {"<<": "YAML merge keys are not supported; put shared values under 'defaults'."}
)
_DEFAULTS_HINTS = MappingProxyType(
    {**_YAML_HINTS, "host": "'host' has no default; each entry under 'hosts' names its own."}
)
_HOST_HINTS = MappingProxyType(
    {**_YAML_HINTS, "transport": "'transport' applies to every host: put it under 'defaults'."}
)
_HOSTFILE_HINTS = MappingProxyType(
    {
        "host": "the host name is the first word of the line.",
        "env": "'env' needs a YAML inventory.",
        "health": "'health' needs a YAML inventory.",
    }
)
_HOSTFILE_FORM = "`host [slots=N] [key=value ...]`"
_FORMS = f"expected YAML with a 'hosts:' list, or a hostfile with one {_HOSTFILE_FORM} per line"


def _check(doc: _Doc, rule: _Rule, value: object, where: _Where, hint: str = "") -> Any:
    if not rule.check(value):
        doc.fail(where, f"expected {rule.expected}, got {_show(value)}{hint}.")
    return value


# --- YAML ----------------------------------------------------------------------------------

_TAG = "tag:yaml.org,2002:"
_BOOL, _NULL = _TAG + "bool", _TAG + "null"


def _compose(doc: _Doc) -> Optional[yaml.Node]:
    """The YAML node tree (with line marks), or None for an empty document."""
    try:
        return yaml.compose(doc.text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        doc.fail(_mark_where(exc.problem_mark or exc.context_mark), f"not valid YAML: {what}.")
    except yaml.reader.ReaderError as exc:
        where = _position_where(doc.text, exc.position)
        doc.fail(where, f"not valid YAML: character {chr(exc.character)!r} is not allowed.")
    except yaml.YAMLError as exc:
        doc.fail(_Where(""), f"not valid YAML: {exc}.")
    except RecursionError:
        doc.fail(_Where(""), "not an inventory: the YAML is nested too deeply.")


def _mark_where(mark: Optional[yaml.Mark], path: str = "") -> _Where:
    return _Where(path, mark.line + 1, mark.column) if mark is not None else _Where(path)


def _position_where(text: str, position: int) -> _Where:
    before = _LINE_BREAK.split(text[:position])
    return _Where("", len(before), len(before[-1]))


def _at(path: str, node: yaml.Node) -> _Where:
    return _mark_where(node.start_mark, path)


def _construct(node: yaml.Node) -> Any:
    """The value YAML gives the scalar, or its text when YAML cannot build one."""
    try:
        return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError):
        return node.value  # an unknown tag, a bad date or a 5000-digit int


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _show(_construct(node))


def _type_hint(node: yaml.ScalarNode, rule: _Rule) -> str:
    if node.tag == _NULL and not node.value:
        return " (the value is empty)"
    if node.tag in (_BOOL, _NULL):
        kind = "a boolean" if node.tag == _BOOL else "null"
        quote = "; quote it to mean the text" if rule.text else ""
        return f" (YAML reads {node.value} as {kind}{quote})"
    if not rule.text and node.style in ("'", '"'):
        return " (a quoted string; write the number without quotes)"
    return ""


def _read_scalar(doc: _Doc, rule: _Rule, node: yaml.Node, where: _Where) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        doc.fail(where, f"expected {rule.expected}, got {_kind(node)}.")
    # Names keep the text as written: YAML would make `1:30` an int and `2024-01-01` a date.
    text = rule.text and node.tag not in (_BOOL, _NULL)
    value = node.value if text else _construct(node)
    return _check(doc, rule, value, where, _type_hint(node, rule))


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL


_Items = dict[str, tuple["yaml.Node", "yaml.Node"]]


def _items(
    doc: _Doc,
    node: yaml.MappingNode,
    path: str,
    known: Optional[tuple[str, ...]],
    hints: Mapping[str, str] = _YAML_HINTS,
) -> _Items:
    """The mapping's entries by key name, rejecting duplicate and (if ``known``) unknown keys."""
    items: _Items = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            doc.fail(_at(path, key_node), f"expected a key name, got {_kind(key_node)}.")
        name = str(key_node.value)
        where = _at(_join(path, name), key_node)
        if name in items:
            first = items[name][0].start_mark.line + 1
            doc.fail(where, f"duplicate key {_show(name)}; it is first given at line {first}.")
        if known is not None and name not in known:
            _unknown_key(doc, where, name, known, hints)
        items[name] = (key_node, value_node)
    return items


def _value_where(path: str, key_node: yaml.Node, node: yaml.Node) -> _Where:
    # An empty value has no text of its own: point at its key.
    return _at(path, key_node if _is_null(node) and not node.value else node)


def _parse_yaml(doc: _Doc, root: yaml.MappingNode) -> Inventory:
    top = _items(doc, root, "", _TOP_KEYS)
    defaults = _read_section(doc, top.get("defaults"), "defaults", _DEFAULT_KEYS, _DEFAULTS_HINTS)
    if "gpus" in defaults:  # a fix of a host's gpus then names this line too
        defaults["gpus_defaults_line"] = _key_line(top["defaults"][1], "gpus")
    share = defaults.pop("share", ())  # the run's, not a host's
    sync = defaults.pop("sync", None)
    include = defaults.pop("include", ())
    rdzv = _read_section(doc, top.get("rendezvous"), "rendezvous", _RDZV_KEYS)
    if rdzv.get("port") == "auto":
        rdzv["port"] = _AUTO_PORT
    rendezvous = Rendezvous(**rdzv)
    hosts = top.get("hosts")
    if hosts is not None and isinstance(hosts[1], yaml.MappingNode):
        slurm = _slurm_request(doc, hosts, defaults)
        for key in ("spares", "min_nodes"):
            if key in top:
                doc.fail(
                    _at(key, top[key][0]),
                    f"{key} {_SLURM_REFUSES[key]}; a Slurm job's nodes (hosts: {{slurm: ...}}) "
                    "take none.",
                )
        return Inventory(doc.source, (), rendezvous, slurm, share, sync, include)
    if defaults.get("transport") == "srun":
        doc.fail(
            _at("defaults.transport", top["defaults"][1]),
            "transport: srun reaches hosts as steps of a Slurm job; list them as "
            "`hosts: {slurm: JOBID}` (or `slurm: current`), not by name.",
        )
    entries = _hosts_list(doc, root, hosts)
    pairs = [_yaml_host(doc, node, index, defaults) for index, node in enumerate(entries)]
    inventory = _inventory(doc, pairs, rendezvous)
    spares = _yaml_spares(doc, top.get("spares"), defaults)
    spared = _with_spares(doc, inventory, spares, "spares")
    least = _min_nodes(doc, top.get("min_nodes"), len(inventory.hosts))
    return replace(spared, share=share, sync=sync, include=include, min_nodes=least)


def _min_nodes(doc: _Doc, item: Optional[tuple[yaml.Node, yaml.Node]], count: int) -> int:
    """``min_nodes: K``: a whole number from 1 to the number of hosts (0 when absent)."""
    if item is None:
        return 0
    key_node, node = item
    value = _construct(node) if isinstance(node, yaml.ScalarNode) else None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= count:
        return value
    shown = _show(str(node.value)) if isinstance(node, yaml.ScalarNode) else _kind(node)
    doc.fail(
        _value_where("min_nodes", key_node, node),
        f"expected a whole number of nodes from 1 to {count} (the hosts listed), got {shown}; "
        "it is the fewest nodes the run goes on with once a node is lost and no spare is "
        "left (with --max-restarts), like torchrun's --nnodes MIN:MAX.",
    )


def _yaml_spares(
    doc: _Doc, entry: Optional[tuple[yaml.Node, yaml.Node]], defaults: Mapping[str, Any]
) -> list[tuple[Host, _Where]]:
    """``spares:``: a list like ``hosts:`` (the same keys, the same ``defaults``)."""
    if entry is None or _is_null(entry[1]):
        return []
    key_node, node = entry
    if not isinstance(node, yaml.SequenceNode):
        where = _value_where("spares", key_node, node)
        doc.fail(where, f"expected a list of spare hosts (like hosts:), got {_kind(node)}.")
    return [_yaml_host(doc, item, i, defaults, "spares") for i, item in enumerate(node.value)]


def _slurm_request(
    doc: _Doc, entry: tuple[yaml.Node, yaml.Node], defaults: Mapping[str, Any]
) -> SlurmRequest:
    """``hosts: {slurm: JOB}``: a Slurm job's nodes, resolved later (``run.inputs``)."""
    key_node, node = entry
    assert isinstance(node, yaml.MappingNode)
    items = _items(doc, node, "hosts", None)
    other = next((name for name in items if name != "slurm"), None)
    if other is not None or "slurm" not in items:
        keys = f"with key {_show(other)}" if other is not None else "that is empty"
        doc.fail(
            _value_where("hosts", key_node, node),
            f"expected a list of hosts, got a mapping {keys}; the only mapping `hosts:` takes "
            "is `{slurm: JOBID}` (or `{slurm: current}`), for the nodes of a Slurm job.",
        )
    slurm_key, value = items["slurm"]
    job = _read_scalar(doc, _SLURM_RULE, value, _value_where("hosts.slurm", slurm_key, value))
    return SlurmRequest(str(job), doc.source, slurm_key.start_mark.line + 1, dict(defaults))


def _read_section(
    doc: _Doc,
    entry: Optional[tuple[yaml.Node, yaml.Node]],
    path: str,
    known: tuple[str, ...],
    hints: Mapping[str, str] = _YAML_HINTS,
) -> dict[str, Any]:
    if entry is None or _is_null(entry[1]):
        return {}  # `defaults:` with nothing under it means no defaults
    key_node, node = entry
    if not isinstance(node, yaml.MappingNode):
        where = _value_where(path, key_node, node)
        doc.fail(where, f"expected a mapping with keys {', '.join(known)}, got {_kind(node)}.")
    return _read_fields(doc, _items(doc, node, path, known, hints), path)


def _read_fields(doc: _Doc, items: _Items, path: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, (key_node, node) in items.items():
        where = _value_where(_join(path, name), key_node, node)
        if name == "env":
            fields[name] = _read_env(doc, node, where)
        elif name in ("share", "include"):
            fields[name] = _read_paths(doc, node, where, _PATH_RULES[name])
        else:
            rule = _RDZV_PORT_RULE if (path, name) == ("rendezvous", "port") else _RULES[name]
            fields[name] = _read_scalar(doc, rule, node, where)
    return fields


def _read_env(doc: _Doc, node: yaml.Node, where: _Where) -> dict[str, str]:
    if _is_null(node):
        return {}
    if not isinstance(node, yaml.MappingNode):
        doc.fail(where, f"expected a mapping of NAME: value, got {_kind(node)}.")
    env: dict[str, str] = {}
    for name, (name_node, value_node) in _items(doc, node, where.path, None).items():
        path = _join(where.path, name)
        _check(doc, _ENV_NAME_RULE, name, _at(path, name_node))
        value_where = _value_where(path, name_node, value_node)
        env[name] = _read_scalar(doc, _ENV_VALUE_RULE, value_node, value_where)
    return env


_SHARE_RULE = _Rule(
    "a file path relative to the ranks' working directory (snapshot.pt)",
    lambda value: isinstance(value, str) and share_problem(value) is None,
    text=True,
)


_INCLUDE_RULE = _Rule(
    "a gitignore pattern relative to the --workdir ('data/*.bin')",
    lambda value: isinstance(value, str) and bool(value.strip()) and "\0" not in value,
    text=True,
)
#: ``share:`` (paths node 0 hands on) and ``include:`` (ignored --workdir files sent): lists
_PATH_RULES = MappingProxyType({"share": _SHARE_RULE, "include": _INCLUDE_RULE})


def _read_paths(doc: _Doc, node: yaml.Node, where: _Where, rule: _Rule) -> tuple[str, ...]:
    """A list of paths or patterns (``share:``, ``include:``)."""
    if _is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        name = where.path.rsplit(".", 1)[-1]
        doc.fail(where, f"expected a list of paths ({name}: [...]), got {_kind(node)}.")
    paths = []
    for i, item in enumerate(node.value):
        item_where = _at(f"{where.path}[{i}]", item)
        value = str(_read_scalar(doc, rule, item, item_where))
        paths.append(value)
    return tuple(paths)


def _hosts_list(
    doc: _Doc, root: yaml.Node, entry: Optional[tuple[yaml.Node, yaml.Node]]
) -> list[yaml.Node]:
    if entry is None:
        doc.fail(_at("", root), "missing the required key 'hosts' (the list of hosts).")
    key_node, node = entry
    where = _value_where("hosts", key_node, node)
    if _is_null(node) or (isinstance(node, yaml.SequenceNode) and not node.value):
        doc.fail(where, "the list of hosts is empty; expected at least one host.")
    if not isinstance(node, yaml.SequenceNode):
        doc.fail(where, f"expected a list of hosts (or {{slurm: JOBID}}), got {_kind(node)}.")
    return list(node.value)


def _yaml_host(
    doc: _Doc, node: yaml.Node, index: int, defaults: Mapping[str, Any], key: str = "hosts"
) -> tuple[Host, _Where]:
    path = f"{key}[{index}]"
    if isinstance(node, yaml.ScalarNode):  # `- gpu-a` is short for `- host: gpu-a`
        where = _at(path, node)
        own = {"host": _read_scalar(doc, _HOST_RULE, node, where)}
    elif isinstance(node, yaml.MappingNode):
        items = _items(doc, node, path, _HOST_KEYS, _HOST_HINTS)
        if "host" not in items:
            doc.fail(_at(path, node), "missing 'host' (an ssh alias, hostname or IP address).")
        own = _read_fields(doc, items, path)
        where = _at(f"{path}.host", items["host"][1])
    else:
        doc.fail(_at(path, node), "expected a host name or a mapping with 'host', got a list.")
    return _make_host(own, defaults, index, node.start_mark.line + 1), where


def _key_line(node: yaml.Node, key: str) -> int:
    """The 1-based line of ``key`` in the mapping ``node`` (0 where it is not there)."""
    for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
        if getattr(key_node, "value", None) == key:
            return int(key_node.start_mark.line) + 1
    return 0


def _make_host(own: Mapping[str, Any], defaults: Mapping[str, Any], index: int, line: int) -> Host:
    merged = {**defaults, **own}
    if "gpus" in own:
        merged.pop("gpus_defaults_line", None)
    merged["env"] = {**defaults.get("env", {}), **own.get("env", {})}  # host wins per name
    return Host(index=index, line=line, **merged)


def _inventory(doc: _Doc, pairs: list[tuple[Host, _Where]], rendezvous: Rendezvous) -> Inventory:
    """The inventory, once no host is listed twice (``where`` points at each host name)."""
    first: dict[tuple[str, Optional[int]], Host] = {}
    for host, where in pairs:
        key = (host.host, host.port)
        if key in first:
            port = f" port {host.port}" if host.port is not None else ""
            doc.fail(
                where,
                f"host {_show(host.host)}{port} is listed twice, at lines {first[key].line} and "
                f"{host.line}; list each host once and set gpus or nproc for more processes.",
            )
        first[key] = host
    return Inventory(doc.source, tuple(host for host, _ in pairs), rendezvous)


def _with_spares(
    doc: _Doc, inventory: Inventory, spares: list[tuple[Host, _Where]], key: str
) -> Inventory:
    """``inventory`` with its spares, once none is a host of the run or listed twice, and
    each could take some node's place (the same process count)."""
    seen = {(h.host, h.port): _host_at(h) for h in inventory.hosts}
    counts = sorted({h.procs for h in inventory.hosts})
    for spare, where in spares:
        name = (spare.host, spare.port)
        at = f"line {spare.line}" if spare.line else f"entry {spare.index + 1}"
        if name in seen:
            also = seen[name] if seen[name].startswith("in ") else f"twice ({seen[name]})"
            doc.fail(
                where,
                f"spare {_show(spare.host)} is also listed {also}; a spare is a host that is "
                f"not in the run: list it once, under {key} or under hosts.",
            )
        seen[name] = at
        if spare.procs not in counts:
            doc.fail(
                where,
                f"spare {_show(spare.host)} runs {spare.procs} process(es), and no node of the "
                f"run has that many ({', '.join(map(str, counts))}); a spare takes a node's "
                "place with the same process count: set its gpus or nproc to match.",
            )
    return replace(inventory, spares=tuple(spare for spare, _ in spares))


def _host_at(host: Host) -> str:
    return f"in hosts (line {host.line})" if host.line else f"in -H (entry {host.index + 1})"


def with_spare_list(inventory: Inventory, text: str, source: str = "--spares") -> Inventory:
    """``--spares HOST[:N],...`` added to ``inventory`` (parsed like ``-H``)."""
    doc = _Doc.of(text, source)
    if not text.strip():
        doc.fail(_Where(""), f"no hosts; expected {HOST_LIST_FORM}.")
    first = inventory.hosts[0] if inventory.hosts else None
    defaults = {} if first is None else {"python": first.python, "user": first.user}
    pairs = [
        _list_host(doc, entry, i, defaults, "spares") for i, entry in enumerate(text.split(","))
    ]
    return _with_spares(doc, inventory, pairs, "--spares")


def _require_mapping(doc: _Doc, root: Optional[yaml.Node]) -> yaml.MappingNode:
    if root is None:
        doc.fail(_Where(""), f"the inventory is empty; {_FORMS}.")
    if not isinstance(root, yaml.MappingNode):
        doc.fail(_at("", root), f"{_FORMS}; got {_kind(root)} at the top level.")
    return root


def _parse_auto(doc: _Doc) -> Inventory:
    try:
        root = _compose(doc)
    except InventoryError:
        if _looks_like_hostfile(doc):
            return _parse_hostfile(doc)
        raise
    if isinstance(root, yaml.ScalarNode):
        # Hostfile lines read as one YAML string, which is never a YAML inventory.
        return _parse_hostfile(doc)
    return _parse_yaml(doc, _require_mapping(doc, root))


# --- hostfile ------------------------------------------------------------------------------

_TOKEN = re.compile(r"\S+")
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,18}")


def _words(line: str) -> list[tuple[int, str]]:
    """(column, word) of each word before a `#` comment."""
    return [(match.start(), match.group()) for match in _TOKEN.finditer(line.split("#", 1)[0])]


def _looks_like_hostfile(doc: _Doc) -> bool:
    """Whether the first line with words reads `host key=value ...` (for text YAML rejects)."""
    for line in doc.lines:
        words = [word for _, word in _words(line)]
        if words:
            head = words[0]
            pairs = all("=" in word for word in words[1:])
            return _HOST_RULE.check(head) and pairs
    return False


def _parse_hostfile(doc: _Doc) -> Inventory:
    pairs: list[tuple[Host, _Where]] = []
    for number, line in enumerate(doc.lines, start=1):
        words = _words(line)
        if words:
            pairs.append(_hostfile_host(doc, words, number, len(pairs)))
    if not pairs:
        doc.fail(_Where(""), f"the inventory is empty; {_FORMS}.")
    return _inventory(doc, pairs, Rendezvous())


def _yaml_look(word: str) -> str:
    return " (this looks like YAML; name the file *.yaml)" if word.endswith(":") else ""


def _hostfile_host(
    doc: _Doc, words: list[tuple[int, str]], number: int, index: int
) -> tuple[Host, _Where]:
    path = f"hosts[{index}]"
    col, name = words[0]
    where = _Where(path, number, col)
    fields: dict[str, Any] = {"host": _check(doc, _HOST_RULE, name, where, _yaml_look(name))}
    for col, word in words[1:]:
        key, value = _hostfile_pair(doc, word, _Where(path, number, col), fields)
        fields[key] = value
    return _make_host(fields, {}, index, number), where


def _hostfile_pair(doc: _Doc, word: str, where: _Where, seen: Mapping[str, Any]) -> tuple[str, Any]:
    key, equals, text = word.partition("=")
    if not equals:
        message = f"expected key=value, got {_show(word)}{_yaml_look(word)}"
        doc.fail(where, f"{message}; a hostfile line is {_HOSTFILE_FORM}.")
    where = replace(where, path=_join(where.path, key))
    if key not in _HOSTFILE_KEYS:
        _unknown_key(doc, where, key, _HOSTFILE_KEYS, _HOSTFILE_HINTS)
    name = "gpus" if key == "slots" else key
    if name in seen:
        also = " (slots= sets gpus)" if name == "gpus" else ""
        doc.fail(where, f"{name!r} is given twice on this line{also}.")
    rule = _RULES[name]
    value: Any = int(text) if not rule.text and _INT_TEXT.fullmatch(text) else text
    return name, _check(doc, rule, value, replace(where, col=where.col + len(key) + 1))


# --- a host list on the command line (-H) ----------------------------------------------------

HOST_LIST_FORM = "HOST[:N],HOST[:N],... (N: the host's processes, its GPUs or CPU processes)"


def parse_host_list(
    text: str,
    *,
    python: Optional[str] = None,
    user: Optional[str] = None,
    source: str = "-H",
) -> Inventory:
    """``-H gpu-a:8,gpu-b:8`` as an inventory: host i is node rank i with N processes.

    ``python`` and ``user`` play the part of a YAML inventory's ``defaults``. Every value
    goes through the same checks as an inventory's; an error names the entry by position.
    """
    doc = _Doc.of(text, source)
    defaults: dict[str, Any] = {}
    for name, value in (("python", python), ("user", user)):
        if value is not None:
            defaults[name] = _check(doc, _RULES[name], value, _Where(f"--{name}"))
    if not text.strip():
        doc.fail(_Where(""), f"no hosts; expected {HOST_LIST_FORM}.")
    pairs = [_list_host(doc, entry, i, defaults) for i, entry in enumerate(text.split(","))]
    seen: dict[tuple[str, Optional[int]], int] = {}
    for host, where in pairs:
        first = seen.setdefault((host.host, host.port), host.index)
        if first != host.index:
            doc.fail(
                where,
                f"host {_show(host.host)} is listed twice, as entries {first + 1} and "
                f"{host.index + 1}; list each host once with its process count (HOST:N).",
            )
    return _inventory(doc, pairs, Rendezvous())


_POSITIVE_RULE = _Rule(
    f"a positive integer up to {defaults.MAX_PROCS_PER_NODE}",
    lambda value: _is_count(value) and value > 0,
    text=False,
)


def _list_host(
    doc: _Doc, entry: str, index: int, defaults: Mapping[str, Any], key: str = "hosts"
) -> tuple[Host, _Where]:
    where = _Where(f"{key}[{index}] (entry {index + 1}, {_show(entry)})")
    if not entry:
        doc.fail(where, f"an empty entry; expected {HOST_LIST_FORM}.")
    name, colon, text = entry.rpartition(":")
    count: Optional[str] = text
    if not colon or entry.endswith("]") or (":" in name and not name.endswith("]")):
        name, count = entry, None  # no count, or an IPv6 address without brackets
    own: dict[str, Any] = {"host": _check(doc, _HOST_RULE, name, where)}
    if count is not None:
        number = int(count) if _INT_TEXT.fullmatch(count) else count
        own["nproc"] = _check(doc, _POSITIVE_RULE, number, where, " after the ':'")
    return _make_host(own, defaults, index, 0), where
