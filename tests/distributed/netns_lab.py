"""Hosts on one machine for the multi-host test: Linux network namespaces joined by veth pairs to a bridge that lives
in a namespace of its own, so the test's addresses exist only inside the namespaces it makes (the machine's own
network is never touched), and a throwaway CA with certificates for NATS's TLS (the openssl CLI).

Processes run in a namespace under `ip netns exec NS`; the test itself talks to a namespace through NsClient, an
HTTP client whose one thread has entered it (a network namespace belongs to a thread: setns(2))."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

CLONE_NEWNET = 0x40000000
SUBNET = "10.213.36"  # exists only inside the test's namespaces


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def why_no_namespaces() -> str | None:
    """None when this machine lets the test make network namespaces, else the reason (the skip's)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add); this test runs as a user"
    for tool in ("ip", "openssl"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on this machine"
    probe = f"kevprobe{os.getpid()}"
    try:
        ip("netns", "add", probe)
        ip("-n", probe, "link", "add", "br0", "type", "bridge")
    except OSError as err:
        return f"cannot make a network namespace with a bridge here: {err}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


@dataclass
class Lab:
    """Namespaces named `kev<pid>-<host>`, each with one address SUBNET.<n> on a veth to the hub's bridge."""

    tag: str = field(default_factory=lambda: f"kev{os.getpid()}")
    hosts: dict[str, str] = field(default_factory=dict)  # host -> address
    made: list[str] = field(default_factory=list)  # namespaces, to delete

    @property
    def hub(self) -> str:
        return f"{self.tag}-hub"

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def link(self, host: str) -> str:
        return f"v{list(self.hosts).index(host)}"  # the host's end; the hub's end is h<n>

    def up(self, hosts: list[str]) -> Lab:
        self._add(self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for n, host in enumerate(hosts):
            ns, address = self.ns(host), f"{SUBNET}.{n + 1}"
            self._add(ns)
            ip("link", "add", f"v{n}", "netns", ns, "type", "veth", "peer", "name", f"h{n}", "netns", self.hub)
            ip("-n", self.hub, "link", "set", f"h{n}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", f"v{n}")
            ip("-n", ns, "link", "set", f"v{n}", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            self.hosts[host] = address
        return self

    def set_link(self, host: str, state: str) -> None:
        """`ip link set ... down|up` on the host's own end: the host is cut off from every other."""
        ip("-n", self.ns(host), "link", "set", self.link(host), state)

    def exec_prefix(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host)]

    def _add(self, ns: str) -> None:
        ip("netns", "add", ns)
        self.made.append(ns)

    def down(self) -> None:
        """Delete every namespace made (their veths go with them); the processes in them must be gone first."""
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made.clear()


@contextmanager
def lab(hosts: list[str]) -> Iterator[Lab]:
    made = Lab()
    try:
        yield made.up(hosts)
    finally:
        made.down()


def enter(ns: str) -> None:
    """The calling thread joins network namespace ns (its sockets are made there from now on)."""
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)


class NsClient:
    """An httpx.Client whose every call runs on one thread inside network namespace ns (get, post, request…)."""

    def __init__(self, ns: str, base_url: str, timeout: float = 300) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"in-{ns}", initializer=enter, initargs=(ns,))
        self._client: httpx.Client = self._pool.submit(httpx.Client, base_url=base_url, timeout=timeout).result()
        self.base_url = self._client.base_url

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        return lambda *args, **kwargs: self._pool.submit(method, *args, **kwargs).result()

    def close(self) -> None:
        self._pool.submit(self._client.close).result()
        self._pool.shutdown()


def openssl(*args: str | Path, cwd: Path) -> None:
    done = subprocess.run(["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise OSError(f"openssl {' '.join(map(str, args))}: {done.stderr.strip()}")


def certificates(folder: Path, server_ip: str) -> dict[str, Path]:
    """A throwaway CA (one day), a server certificate for server_ip and one client certificate (mutual TLS).
    P-256 keys: quick to make."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=kev test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=folder)
    for name, extensions in (("server", f"subjectAltName=IP:{server_ip}\nextendedKeyUsage=serverAuth\n"),
                             ("client", "extendedKeyUsage=clientAuth\n")):
        (folder / f"{name}.ext").write_text(extensions)
        openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=kev {name}", cwd=folder)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=folder)
    return {name: folder / name for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}
