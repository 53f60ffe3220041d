"""CurveZMQ for the remote bus: key files, the recorder's allow-list, client settings.

Why CURVE and a ZAP handler: an agent on another host talks to the recorder over TCP, and
the run file must only hold what listed agents sent. CURVE encrypts and authenticates every
connection; the ZAP handler (pyzmq's ``ThreadAuthenticator``) accepts a client only if its
public key is in the allow-list folder, and names the peer after the key file, so the
recorder knows *which* agent sent each message (``User-Id``) and can bind sources to it.

Key files use the ZeroMQ certificate text format (``zmq.auth.load_certificate`` reads
them): ``NAME.key`` holds the public key, ``NAME.key_secret`` both keys. Both are created
mode 0600; a secret file readable by group or others is refused.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from wattlab.errors import UsageError
from wattlab.samples import SOURCE_ID_PATTERN
from wattlab.sync.bus.refusal_log import RefusalLog

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
ZAP_DOMAIN = "wattlab"
log = logging.getLogger("wattlab.security")


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair (z85 bytes) and the name it was created for."""

    name: str
    public: bytes
    secret: bytes


@dataclass(frozen=True)
class ClientSecurity:
    """What a client socket needs: its own pair and the recorder's public key."""

    keys: KeyPair
    server_public: bytes

    def apply(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)


def _check_name(name: str) -> str:
    if not SOURCE_ID_PATTERN.match(name) or "." in name:
        raise UsageError(f"key name {name!r}: use 1-64 letters, digits, '_' or '-' (no dots); "
                         "an agent's name prefixes its stream ids")
    return name


def _write_private(path: Path, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as e:
        raise UsageError(f"{path}: already exists; wattlab never overwrites a key") from e
    except OSError as e:
        raise UsageError(f"{path}: cannot create key file: {e}") from e
    with os.fdopen(fd, "w") as f:
        f.write(text)


def create_keypair(folder: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` (both 0600) into ``folder``."""
    _check_name(name)
    if not zmq.has("curve"):
        raise UsageError("this libzmq has no CURVE support; cannot create keys")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    head = f"#   wattlab CURVE key for {name!r}\n#   created by `wattlab keys`\n"
    meta = f'metadata\n    name = "{name}"\ncurve\n    public-key = "{public.decode()}"\n'
    pub_path, sec_path = out / f"{name}{PUBLIC_SUFFIX}", out / f"{name}{SECRET_SUFFIX}"
    if pub_path.exists() or sec_path.exists():
        raise UsageError(f"{out}: a key named {name!r} already exists; wattlab never "
                         "overwrites a key")
    _write_private(sec_path, head + "#   SECRET: never copy this file off its host\n"
                   + meta + f'    secret-key = "{secret.decode()}"\n')
    _write_private(pub_path, head + meta)
    return pub_path, sec_path


def _name_of(path: Path) -> str:
    name = path.name
    for suffix in (SECRET_SUFFIX, PUBLIC_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def load_keypair(secret_path: str | Path) -> KeyPair:
    """A secret key file (``NAME.key_secret``); refused if others may read it."""
    path = Path(secret_path)
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise UsageError(f"{path}: cannot read key file: {e}") from e
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"{path}: secret key is readable by others (mode "
                         f"{stat.S_IMODE(mode):o}); run chmod 600 {path}")
    public, secret = _load(path)
    if secret is None:
        raise UsageError(f"{path}: holds no secret key (give the NAME{SECRET_SUFFIX} file)")
    return KeyPair(_check_name(_name_of(path)), public, secret)


def load_public_key(path: str | Path) -> bytes:
    """The public key from either file of a pair (e.g. the recorder's ``.key``)."""
    return _load(Path(path))[0]


def _load(path: Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a readable CURVE key file: {e}") from e
    if public is None or len(public) != 40:
        raise UsageError(f"{path}: no valid public key in the file")
    return public, secret


def load_allowed_keys(folder: str | Path) -> dict[bytes, str]:
    """Every ``NAME.key`` in ``folder`` → {public key: NAME}; names and keys must be unique."""
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(f"{root}: allowed-keys folder does not exist")
    allowed: dict[bytes, str] = {}
    for path in sorted(root.glob(f"*{PUBLIC_SUFFIX}")):
        name = _check_name(_name_of(path))
        key = load_public_key(path)
        if key in allowed:
            raise UsageError(f"{path}: same key as {allowed[key]!r}")
        if name in allowed.values():
            raise UsageError(f"{path}: name {name!r} used twice")
        allowed[key] = name
    if not allowed:
        raise UsageError(f"{root}: no *{PUBLIC_SUFFIX} files; nobody could connect")
    return allowed


class _AllowList:
    """ZAP credentials callback: listed keys pass; every refusal is counted.

    Refusals are logged at most once a second, with their count: a client retrying with
    fresh keys must not fill the disk with log lines (issue 36).
    """

    def __init__(self, allowed: dict[bytes, str]) -> None:
        self.allowed = allowed
        self.refused = 0
        self.last_refused = ""
        self.log = RefusalLog(log.warning)

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allowed:
            return True
        self.refused += 1
        self.last_refused = key.decode(errors="replace")
        self.log.note("peer(s) with an unknown CURVE key",
                      f"the last: key {self.last_refused} (domain {domain})")
        return False


class _NamingAuthenticator(ThreadAuthenticator):
    """Sets each peer's ZeroMQ ``User-Id`` to its key file's name."""

    names: dict[bytes, str] = {}

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.names.get(zmq.utils.z85.encode(client_public_key), "unknown")


class CurveServer:
    """The recorder's side: a ZAP authenticator on ``context`` and a server socket setup."""

    def __init__(self, context: zmq.Context[Any], server_keys: KeyPair,
                 allowed: dict[bytes, str]) -> None:
        self.server_keys = server_keys
        self.allow_list = _AllowList(allowed)
        self._auth = _NamingAuthenticator(context, log=log)
        self._auth.names = dict(allowed)
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self.allow_list)

    @property
    def refused(self) -> int:
        return self.allow_list.refused

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE server that asks the authenticator about every peer."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.server_keys.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.server_keys.public)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())

    def stop(self) -> None:
        self._auth.stop()
        self.allow_list.log.flush_lines()
