"""Spares at launch: before the plan, reach the run's hosts and its spares in one fan-out,
run the inventory's ``health:`` command on those that set one, and give a spare the node
rank of each host that is unreachable, unhealthy or quarantined.

Only an inventory with spares pays for this: its hosts are connected once here, before the
preflight connects them again (and runs the ``health:`` command again, on the hosts that
will run). Nothing has been recorded or started when it runs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Optional

from sshddp import defaults
from sshddp.hosts import shipped
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions, Transport
from sshddp.model.envvars import EnvPairs
from sshddp.model.health import command_problem
from sshddp.model.inventory import Host, Inventory
from sshddp.model.quarantine import Quarantine, Verdict, not_there, the_hosts_fault, when
from sshddp.model.quarantine.spares import Choice, choose
from sshddp.run.quarantine import ends, store


def swap_bad_hosts(
    inventory: Inventory,
    ssh: SshOptions,
    fanout: int,
    say: Callable[[str], None],
    ignore_quarantine: bool = False,
    quarantine_for: Optional[float] = None,
    env: EnvPairs = (),
) -> Inventory:
    """``inventory`` with a spare in place of each bad host, each swap said in one line.
    Where some bad node finds no usable spare, each such node is said (its host and every
    spare, and why none fits) and the inventory is kept: the launch fails through that
    host as it would without spares (unreachable, or the quarantine's refusal). A host
    swapped out because no connection reached it is quarantined (``quarantine_for``), as
    the preflight quarantines one without spares. ``env``: ``--env``, applied over each
    host's inventory env for its ``health:`` command, as the preflight applies it."""
    if not inventory.spares:
        return inventory
    quarantined = {} if ignore_quarantine else _quarantined(inventory)
    unreachable, unhealthy = _look(inventory, ssh, fanout, env)
    hosts, spares = inventory.hosts, inventory.spares
    bad = {h.index: _why(h, quarantined, unreachable, unhealthy) for h in hosts}
    spare_bad = {s.host: _why(s, quarantined, unreachable, unhealthy) for s in spares}
    choice = choose(
        hosts,
        {i: w for i, w in bad.items() if w},
        spares,
        {n: w for n, w in spare_bad.items() if w},
    )
    swapped = _said(inventory, choice, say)
    if swapped is not inventory:
        for line in ends.after_swap(_gone(choice, unreachable, unhealthy), quarantine_for):
            say(line)
    # those left wait as the run's spares (--max-restarts): none bad, none taken already
    taken = {(h.host, h.port) for h in swapped.hosts}
    left = [s for s in spares if not spare_bad.get(s.host) and (s.host, s.port) not in taken]
    return replace(swapped, spares=tuple(left))


def _gone(choice: Choice, unreachable: dict[str, str], unhealthy: dict[str, str]) -> list[Verdict]:
    """The swapped-out hosts that no connection reached (not a login or a key refused),
    and those that failed their ``health:`` command."""
    out = []
    for swap in choice.swaps:
        name = swap.old.host
        said = f"{name}: {unreachable.get(name, '')}"
        if name in unreachable and not_there(said):
            out.append(Verdict(name, "unreachable at launch", said))
        elif name in unhealthy:
            out.append(Verdict(name, "failed its health check", unhealthy[name]))
    return out


def _said(inventory: Inventory, choice: Choice, say: Callable[[str], None]) -> Inventory:
    if choice.unfilled:
        for node in choice.unfilled:
            say(node.line())
        return inventory
    for swap in choice.swaps:
        say(swap.line())
    return replace(inventory, hosts=choice.hosts)


def _why(
    host: Host, quarantined: dict[str, str], unreachable: dict[str, str], unhealthy: dict[str, str]
) -> str:
    """Why ``host`` cannot run a node ('' when it can): unreachable first, as the more
    immediate reason, then unhealthy now, then quarantined from before."""
    if host.host in unreachable:
        return f"unreachable ({unreachable[host.host]})"
    if host.host in unhealthy:
        return f"unhealthy ({unhealthy[host.host]})"
    return quarantined.get(host.host, "")


def _quarantined(inventory: Inventory) -> dict[str, str]:
    """The quarantined hosts and spares, with why."""
    now = time.time()
    found: Quarantine = store.load()
    out = {}
    for host in (*inventory.hosts, *inventory.spares):
        entry = found.of(host.host, now)
        if entry is not None:
            out[host.host] = f"quarantined until {when(entry.until)} ({entry.reason})"
    return out


def _look(
    inventory: Inventory, ssh: SshOptions, fanout: int, env: EnvPairs
) -> tuple[dict[str, str], dict[str, str]]:
    """The hosts and spares that cannot be connected to, with the connection's error; and
    those among the others whose ``health:`` command fails, with what it said. The spares
    are numbered after the hosts: the pool keys its hosts by index."""
    count = len(inventory.hosts)
    spares = [replace(s, index=count + s.index) for s in inventory.spares]
    everyone = [*inventory.hosts, *spares]
    with HostPool(everyone, ssh, fanout) as pool:
        errors = pool.connect_all()
        checked = [h for h in everyone if h.health and errors.get(h.index) is None]
        looks = pool.map(lambda h: _health(pool.transport(h), h, env), checked)
    unreachable = {}
    for host in everyone:
        err = errors.get(host.index)
        if err is not None:
            unreachable[host.host] = _short(host.host, err.message)
    unhealthy = {}
    for host in checked:
        said = looks[host.index].value  # None: the look itself failed; the preflight says why
        if said:
            unhealthy[host.host] = said
    return unreachable, unhealthy


def _health(transport: Transport, host: Host, env: EnvPairs) -> str:
    """What ``host``'s ``health:`` command found wrong with it ("" when it passed, or when
    the shell could not run the command: that is the inventory's to fix, and the preflight
    says so)."""
    look = {
        "hardware": False,
        "command": host.health,
        "timeout": defaults.HEALTH_TIMEOUT,
        "keep": defaults.HEALTH_OUTPUT,
    }
    answer = shipped.call(
        transport, "host_health", {"health": look, "env": {**host.env, **dict(env)}}
    )
    result = (answer.get("health") or {}).get("command") or {}
    level, message, _ = command_problem(str(host.health), result, defaults.HEALTH_TIMEOUT)
    return message if level == "fail" and the_hosts_fault(message) else ""


def _short(name: str, message: str) -> str:
    """The connection error without the host name it starts with."""
    prefix = f"{name}: "
    return message[len(prefix) :] if message.startswith(prefix) else message
