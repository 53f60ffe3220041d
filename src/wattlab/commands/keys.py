"""`wattlab keys NAME...`: create CurveZMQ key pairs for the recorder and its agents."""

from __future__ import annotations

import argparse
from typing import Any

from wattlab.arg_types import Folder
from wattlab.sync.bus import create_keypair


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "keys", help="create CurveZMQ key pairs for remote agents and the recorder",
        description="Create NAME.key (public) and NAME.key_secret (secret) for each NAME, "
                    "both mode 0600. Give the recorder its own pair and each agent one; put "
                    "the agents' .key files in the recorder's --allow-keys folder and the "
                    "recorder's .key on every agent (--server-key). Never overwrites a key.")
    p.add_argument("names", nargs="+", metavar="NAME",
                   help="who the pair is for, e.g. recorder node1 node2 (no dots)")
    p.add_argument("-d", "--dir", default=".", type=Folder("keys folder"),
                   help="folder to write into (default: .)")
    return p


def run(args: argparse.Namespace) -> int:
    for name in args.names:
        public, secret = create_keypair(args.dir, name)
        print(f"{name}: public {public}  secret {secret}")
    return 0
