"""The network path from this host to the rendezvous, for ``sshddp doctor`` and the preflight.

``facts(target)`` tells which interface a connection to ``target`` (node 0's address) would
leave by and from which address, every interface with its addresses, state and MTU, and the
routes of the main table; the coordinator's checks (``model/checks.py``) decide from these
whether ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` name an interface that exists here and
carries a route to node 0.

Two ways to look, giving the same facts:

* iproute2 when ``ip`` is installed: one ``ip -json -batch`` run lists the addresses and the
  routes and asks ``route get TARGET``, the kernel's own answer (policy routing included);
* otherwise the kernel's files and sockets, no tool needed: a UDP ``connect()`` to the target
  makes the kernel pick the route without sending a packet, and ``getsockname()`` gives its
  source address, whose interface is the one used; interfaces come from
  ``socket.if_nameindex()``, their MTU and state from ``/sys/class/net/*``, IPv4 addresses
  from the SIOCGIFADDR / SIOCGIFNETMASK ioctls, IPv6 ones from ``/proc/net/if_inet6``, and the
  routes from ``/proc/net/route`` and ``/proc/net/ipv6_route``.

A route to an address of this host itself (node 0 looking up its own address) is ``local``;
its interface is then the one that holds the address, not ``lo``, since that is the interface
the other nodes reach it through.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import socket
import struct
import subprocess
from typing import Any, Dict, Optional

from sshddp.remote.common import which

Facts = Dict[str, Any]
IP_TIMEOUT = 10.0
_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
_IFF_UP = 0x1


def resolve(addr: str) -> str:
    """The address ``addr`` resolves to here (what torchrun would connect to first)."""
    infos = socket.getaddrinfo(addr, None, 0, socket.SOCK_STREAM)
    return str(infos[0][4][0])


def facts(addr: str) -> Facts:
    """The route to ``addr``, the interfaces and the routes, by ``ip`` or by the kernel's files."""
    try:
        target = resolve(addr)
    except (OSError, UnicodeError) as exc:
        return {"target": None, "error": f"cannot resolve {addr}: {exc}"}
    found = _by_ip(target) if which("ip") else None
    if found is None:
        found = by_socket(target)
    found["target"] = target
    route = found.get("route")
    if route and route.get("local"):
        route["dev"] = owner(target, found["interfaces"]) or route.get("dev")
    return found


# --- iproute2 ------------------------------------------------------------------------------


def _by_ip(target: str) -> Optional[Facts]:
    """Facts from one ``ip -json -batch`` run; None when ``ip`` fails (the fallback looks)."""
    commands = f"addr show\nroute show table main\nroute get {target}\n"
    try:
        out = subprocess.run(
            ["ip", "-json", "-force", "-batch", "-"],
            input=commands,
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT,
        )
        docs = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    if len(docs) < 2:
        return None
    routes = docs[1]
    if ":" in target:
        routes = _ip_json(["ip", "-json", "-6", "route", "show", "table", "main"]) or []
    got = docs[2][0] if len(docs) > 2 and docs[2] else None
    route = None
    if got:
        local = got.get("type") == "local"
        route = {"dev": got.get("dev"), "src": got.get("prefsrc"), "local": local}
    return {
        "method": "ip",
        "route": route,
        "interfaces": {i["ifname"]: _ip_interface(i) for i in docs[0] if "ifname" in i},
        "routes": [{"dst": r.get("dst"), "dev": r.get("dev")} for r in routes if r.get("dev")],
    }


def _ip_json(argv: list[str]) -> Optional[Any]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT)
        return json.loads(out.stdout) if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def _ip_interface(link: dict[str, Any]) -> Facts:
    addrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if "local" in a]
    return {"mtu": link.get("mtu"), "up": "UP" in link.get("flags", []), "addrs": addrs}


# --- the kernel's files and sockets ---------------------------------------------------------


def by_socket(target: str) -> Facts:
    """The same facts without iproute2 (see the module docstring)."""
    interfaces = {name: _sys_interface(name) for _, name in socket.if_nameindex()}
    for name, addrs in _inet6_addrs().items():
        if name in interfaces:
            interfaces[name]["addrs"] += addrs
    return {
        "method": "socket",
        "route": _udp_route(target, interfaces),
        "interfaces": interfaces,
        "routes": _proc_routes(":" in target),
    }


def _udp_route(target: str, interfaces: dict[str, Facts]) -> Optional[Facts]:
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((target, 9))  # no packet is sent: connect() only picks the route
            src = str(sock.getsockname()[0])
    except OSError:
        return None
    ip = ipaddress.ip_address(target)
    local = ip.is_loopback or any(
        _host_of(a) == target for i in interfaces.values() for a in i["addrs"]
    )
    dev = owner(src, interfaces) if not ip.is_loopback else owner(target, interfaces)
    return {"dev": dev, "src": src, "local": local}


def _sys_interface(name: str) -> Facts:
    base = f"/sys/class/net/{name}"
    mtu = _read_int(f"{base}/mtu")
    flags = _read_int(f"{base}/flags", 16)
    return {"mtu": mtu, "up": bool(flags and flags & _IFF_UP), "addrs": _inet4_addrs(name)}


def _read_int(path: str, base: int = 10) -> Optional[int]:
    try:
        with open(path) as fh:
            return int(fh.read().strip(), base)
    except (OSError, ValueError):
        return None


def _inet4_addrs(name: str) -> list[str]:
    """The interface's IPv4 address with its prefix length, by ioctl (no tool needed)."""
    packed = struct.pack("256s", name.encode()[:15])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            addr = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, packed)[20:24]
            mask = fcntl.ioctl(sock.fileno(), _SIOCGIFNETMASK, packed)[20:24]
    except OSError:
        return []
    prefix = bin(int.from_bytes(mask, "big")).count("1")
    return [f"{socket.inet_ntoa(addr)}/{prefix}"]


def _inet6_addrs() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for fields in _rows("/proc/net/if_inet6"):
        if len(fields) >= 6:
            addr = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
            found.setdefault(fields[5], []).append(f"{addr}/{int(fields[2], 16)}")
    return found


def _proc_routes(v6: bool) -> list[Facts]:
    """The main table's routes of the target's family (``ip route show`` would list)."""
    routes = []
    for fields in [] if v6 else _rows("/proc/net/route")[1:]:
        if len(fields) >= 8:
            dst = socket.inet_ntoa(struct.pack("<I", int(fields[1], 16)))
            prefix = bin(int(fields[7], 16)).count("1")
            routes.append(
                {"dst": "default" if prefix == 0 else f"{dst}/{prefix}", "dev": fields[0]}
            )
    for fields in _rows("/proc/net/ipv6_route") if v6 else []:
        if len(fields) >= 10 and fields[9] != "lo":
            dst6 = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
            prefix = int(fields[1], 16)
            routes.append(
                {"dst": "default" if prefix == 0 else f"{dst6}/{prefix}", "dev": fields[9]}
            )
    return routes


def _rows(path: str) -> list[list[str]]:
    try:
        with open(path) as fh:
            return [line.split() for line in fh]
    except OSError:
        return []


# --- shared ---------------------------------------------------------------------------------


def _host_of(cidr: str) -> str:
    return cidr.split("/")[0]


def owner(addr: str, interfaces: dict[str, Facts]) -> Optional[str]:
    """The interface holding ``addr``, else the one whose subnet holds it (``lo`` for
    127.0.0.0/8), else None."""
    ip = ipaddress.ip_address(addr)
    within = None
    for name, info in interfaces.items():
        for cidr in info.get("addrs") or []:
            if _host_of(cidr) == addr:
                return name
            net = ipaddress.ip_interface(cidr).network
            if within is None and net.version == ip.version and ip in net and net.prefixlen > 0:
                within = name
    return within
