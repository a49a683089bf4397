"""`stoker keys`: CURVE keys and the allow-list of worker hosts."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    """`stoker keys`: CURVE keys and the allow-list."""
    keys = sub.add_parser("keys", help="CURVE keys and the allow-list of worker hosts").add_subparsers(
        dest="keys_command", required=True)
    keys_init = keys.add_parser("init", help="make the service's key pair and an empty allow-list")
    keys_init.add_argument("dir", help="the key folder to make")
    keys_add = keys.add_parser("add", help="make a key pair and allow-list it in its role")
    keys_add.add_argument("dir", help="the key folder (stoker keys init)")
    keys_add.add_argument("name", help="the host's (or consumer's) key name, its --key-name")
    keys_add.add_argument("--role", choices=("worker", "consumer", "job"), default="worker",
                          help="worker (a CPU host, default), consumer (a `stoker train --dispatcher`) or job (a job "
                               "that registers with `stoker fleet`)")
    keys_list = keys.add_parser("list", help="list the keys and the allow-list")
    keys_list.add_argument("dir", help="the key folder (stoker keys init)")


def run(args: argparse.Namespace) -> int:
    from stoker.protos import curve

    if args.keys_command == "init":
        folder = curve.init_keys(args.dir)
        print(f"made {folder}/server.key (give it to every worker host) and {folder}/server.key_secret "
              f"(keep it on the accelerator host); add workers with `stoker keys add {folder} NAME`")
    elif args.keys_command == "add":
        secret = curve.add_key(args.dir, args.name, args.role)
        command = "stoker worker" if args.role == "worker" else "stoker train --dispatcher ..."
        print(f"allow-listed {args.name} as a {args.role}; give {secret} and {args.dir}/server.key to that host and "
              f"run `{command} --keys DIR --key-name {args.name} ...` there")
    else:
        print(json.dumps(curve.list_keys(args.dir), indent=1))
    return 0
