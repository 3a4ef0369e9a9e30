"""``pagetier kube-sync``: keep the node's daemon managing the pods annotated for pagetier.

Runs beside the daemon in the DaemonSet (deploy/daemonset.yaml): every INTERVAL seconds it
lists the pods on $NODE_NAME from the API server, resolves the annotated ones to their cgroups
(daemon/kube.py) and sends the daemon's control socket add_cgroup / remove_cgroup requests.
"""
from __future__ import annotations

import time

import click

from pagetier.cli.run import setup_logging
from pagetier.daemon import control, kube
from pagetier.protocol import socket_path


@click.command("kube-sync")
@click.option("--node", envvar="NODE_NAME", metavar="NAME",
              help="this node's name (default: $NODE_NAME, set from spec.nodeName in the pod)")
@click.option("--interval", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="seconds between two looks at the pods")
@click.option("--socket", "sock", type=click.Path(dir_okay=False), default=None,
              help="the daemon's control socket (default: $PAGETIER_SOCKET, else "
                   "/run/pagetier/control.sock)")
@click.option("--cgroup-root", type=click.Path(file_okay=False), default="/sys/fs/cgroup",
              show_default=True, help="where the host's cgroup v2 hierarchy is mounted")
@click.option("--api-server", metavar="URL",
              help="the API server (default: the in-cluster one, "
                   "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
@click.option("--token-file", type=click.Path(dir_okay=False),
              default=str(kube.SERVICE_ACCOUNT / "token"), show_default=True,
              help="the bearer token (the pod's service account)")
@click.option("--ca-file", type=click.Path(dir_okay=False),
              default=str(kube.SERVICE_ACCOUNT / "ca.crt"), show_default=True,
              help="the CA that signed the API server's certificate")
@click.option("--once", is_flag=True, help="one round, then exit (status 1 if it failed)")
@click.option("-v", "--verbose", is_flag=True, help="also log pods still waiting for a cgroup")
def command(node, interval, sock, cgroup_root, api_server, token_file, ca_file, once, verbose):
    """Manage the pods on this node annotated pagetier.io/fast-budget or pagetier.io/manage.

    \b
    A pod annotated pagetier.io/fast-budget: "2G" is managed with that budget;
    pagetier.io/manage: "true" without one shares the daemon's budget. A bad annotation
    is logged (pod and value) and the pod skipped.

    \b
    Example (in the DaemonSet): pagetier kube-sync --interval 10
    Example (by hand):  pagetier kube-sync --node worker-1 --api-server http://127.0.0.1:8001 --once
    """
    if not node:
        raise click.UsageError("give --node NAME or set NODE_NAME (the DaemonSet sets it from "
                               "spec.nodeName)")
    url = api_server or kube.api_server()
    path = sock or socket_path()
    setup_logging(verbose)
    sync = kube.Sync(lambda req: control.request(path, req))
    kube.run(lambda: kube.list_pods(url, node, token_file, ca_file), sync, node, cgroup_root,
             interval, time.sleep, rounds=1 if once else None)

