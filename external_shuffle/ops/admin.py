"""``pyshuffle admin``: an operator's view of an external shuffle cluster (its workers and
applications, as tables or JSON) and its one action, decommissioning a worker (or cancelling
that); and operators' credentials, signed with the cluster's secret. It reads a client's
configuration: the coordinators' addresses, the token, TLS."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence

from external_shuffle.client.coordinators import Coordinators
from external_shuffle.ops.cluster_view import ClusterView, WorkerRow, merged_applications
from external_shuffle.options import CLIENT_RETRY_TIMEOUT, coordinator_addresses
from external_shuffle.wire.auth import load_token
from external_shuffle.wire.channels import ChannelPool, ClientSettings
from external_shuffle.wire.credentials import (
    CREDENTIAL_PREFIX,
    OPERATOR_ROLES,
    Role,
    operator_token,
)
from external_shuffle.wire.errors import UnavailableError
from external_shuffle.wire.messages import WorkerAddress
from external_shuffle.wire.stubs import pb
from shuffle_api import ConfigError, Configuration, InvalidOperationError
from shuffle_api.plugins import Command
from shuffle_runtime.cli import CLIENT, client_options, validate_for_role

__all__ = ["COMMAND", "main"]

_POLL_SECONDS = 1.0
MAX_CREDENTIAL_DAYS = 366  # a leaked credential lives at most this long (else: a new secret)
_HEARD_POLL_SECONDS = 0.1
# An operator waits this long, at most, to hear that no coordinator answers (with its address),
# not a running job's retry timeout: a command is run again, a job's calls are not.
_PATIENCE_SECONDS = 3.0


def format_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` under ``columns``, each column as wide as its widest cell."""
    table = [tuple(columns), *rows]
    widths = [max(len(row[index]) for row in table) for index in range(len(columns))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    )


class Admin:
    """Calls of an operator to the cluster's coordinators and workers."""

    def __init__(self, configuration: Configuration) -> None:
        settings = ClientSettings.from_configuration(configuration)
        self._channels = ChannelPool(
            dataclasses.replace(settings, timeout=min(settings.timeout, _PATIENCE_SECONDS))
        )
        self._coordinators = Coordinators(
            coordinator_addresses(configuration),
            self._channels,
            retry_timeout=min(configuration.get(CLIENT_RETRY_TIMEOUT), _PATIENCE_SECONDS),
        )

    def close(self) -> None:
        self._channels.close()

    def _worker_entries(self) -> list[pb.ListWorkersResponse.Entry]:
        coordinators = self._coordinators
        answer = coordinators.first(
            "listing workers",
            lambda address: coordinators.stub(address).ListWorkers(
                pb.ListWorkersRequest(), timeout=coordinators.timeout
            ),
        )
        return list(answer.workers)

    def view(self) -> ClusterView:
        coordinators = self._coordinators
        workers = tuple(
            WorkerRow.of(
                WorkerAddress.from_pb(entry.worker),
                entry.load,
                entry.alive,
                entry.seconds_since_heartbeat,
            )
            for entry in self._worker_entries()
        )
        # Each coordinator hears its own drivers: ask them all.
        answers = coordinators.each(
            "listing applications",
            lambda address: coordinators.stub(address).ListApplications(
                pb.ListApplicationsRequest(), timeout=coordinators.timeout
            ),
        )
        heard = [answer.result for answer in answers if answer.result is not None]
        if not heard:
            assert answers[0].error is not None
            raise answers[0].error
        return ClusterView(workers, merged_applications(heard))

    def decommission(self, worker: str, wait: float, *, cancel: bool = False) -> int:
        """Tell ``worker`` (its id, host:port, host or host name: a pod's name), through a
        coordinator, to take no new partitions, or with ``cancel`` to take them again; with
        ``wait``, wait up to that many seconds for its partitions to be released or moved to
        its tier store. Returns those remaining."""
        address = self._worker_named(worker)
        coordinators = self._coordinators
        answer = coordinators.first(
            f"{'cancelling the decommission of' if cancel else 'decommissioning'} {worker}",
            lambda at: coordinators.stub(at).DecommissionWorker(
                pb.DecommissionWorkerRequest(worker_id=address.worker_id, cancel=cancel),
                timeout=coordinators.timeout,
            ),
        )
        remaining = int(answer.partitions_remaining)
        # The coordinator that passed it on knows at once, unless a heartbeat the worker sent
        # before it heard overtook the answer: the next one says it. Return once it knows.
        deadline = time.monotonic() + _PATIENCE_SECONDS
        while self._load(address.worker_id).decommissioning == cancel:
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"{worker}: the coordinator has not heard it yet: check with"
                    " `pyshuffle admin workers`"
                )
            time.sleep(_HEARD_POLL_SECONDS)
        if cancel:
            return remaining
        deadline = time.monotonic() + wait
        while remaining and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
            load = self._load(address.worker_id)
            remaining = load.partitions - load.partitions_on_tier  # moved ones outlive it
        return remaining

    def _worker_named(self, name: str) -> WorkerAddress:
        """The one worker ``name`` names: its id, host:port, host or host name."""
        addresses = [WorkerAddress.from_pb(entry.worker) for entry in self._worker_entries()]
        named = [
            address
            for address in addresses
            if name in (address.worker_id, address.target, address.host, address.hostname)
        ]
        if len(named) == 1:
            return named[0]
        if named:
            several = ", ".join(sorted(f"{a.worker_id} ({a.target})" for a in named))
            raise InvalidOperationError(f"{name!r} names several workers: {several}; give its id")
        known = ", ".join(sorted(address.worker_id for address in addresses))
        raise InvalidOperationError(f"no worker {name!r} is known; known: {known}")

    def _load(self, worker_id: str) -> pb.WorkerLoad:
        """The load the coordinator last heard from ``worker_id`` (empty once it is gone)."""
        loads = {entry.worker.worker_id: entry.load for entry in self._worker_entries()}
        return loads.get(worker_id, pb.WorkerLoad())


def issue_credential(configuration: Configuration, role: Role, name: str, days: float) -> str:
    """An operator's credential for ``days``, signed with the configuration's token, which must
    be the cluster's secret (a credential cannot sign another)."""
    secret = load_token(configuration)
    if secret.startswith(CREDENTIAL_PREFIX):
        raise ConfigError(
            "the config's token is an operator's credential: credentials are signed with the"
            " cluster's secret (the daemons' external-shuffle.auth.token-file)"
        )
    if not 0 < days <= MAX_CREDENTIAL_DAYS:  # NaN too
        raise ConfigError(f"--days must be above 0 and at most {MAX_CREDENTIAL_DAYS}, not {days}")
    return operator_token(secret, role, name, int(time.time() + days * 86_400))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pyshuffle admin",
        description="Workers and applications of an external shuffle cluster, and"
        " decommissioning a worker (or cancelling that); operators' credentials. Reads a"
        " client's config (coordinator address, token or credential).",
    )
    parser.add_argument("--config", metavar="FILE", help="a client's TOML config file")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, listed in (
        ("workers", "each worker: state, heartbeat, partitions, disk"),
        ("applications", "each application: heartbeat, partitions"),
    ):
        listing = commands.add_parser(name, help=listed)
        listing.add_argument(
            "--json", action="store_true", help="one JSON document (plain numbers) on stdout"
        )
    decommission = commands.add_parser(
        "decommission", help="a worker takes no new partitions; its partitions stay readable"
    )
    decommission.add_argument("worker", help="the worker's id or host:port")
    decommission.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for its partitions to be released (drained)",
    )
    cancel = commands.add_parser(
        "cancel-decommission", help="a decommissioning worker takes new partitions again"
    )
    cancel.add_argument("worker", help="the worker's id or host:port")
    credential = commands.add_parser(
        "credential",
        help="print a credential, signed with the cluster's secret (the config's token):"
        " reader (the listings, the status page), admin (and decommissioning), or client (a"
        " team's drivers: registering applications)",
    )
    credential.add_argument(
        "--role", choices=[role.value for role in OPERATOR_ROLES], required=True
    )
    credential.add_argument("--name", required=True, help="who holds it (logged with its calls)")
    credential.add_argument(
        "--days", type=float, default=30.0, help="how long it holds (default: 30)"
    )
    args = parser.parse_args(argv)
    configuration = Configuration.load(toml_file=args.config)
    validate_for_role(configuration, CLIENT, client_options())
    if args.command == "credential":
        print(issue_credential(configuration, Role(args.role), args.name, args.days))
        return 0
    admin = Admin(configuration)
    try:
        if args.command == "decommission":
            remaining = admin.decommission(args.worker, args.wait)
            print(
                f"{args.worker} is decommissioning: it takes no new partitions;"
                f" {remaining} partitions remain (readable until their applications release"
                " them)"
            )
            return 0
        if args.command == "cancel-decommission":
            remaining = admin.decommission(args.worker, 0.0, cancel=True)
            print(f"{args.worker} takes new partitions again; it holds {remaining} partitions")
            return 0
        view = admin.view()
        if args.json:
            records = (
                view.worker_records() if args.command == "workers" else view.application_records()
            )
            print(json.dumps({args.command: records}, indent=2))
        elif args.command == "workers":
            print(format_table(ClusterView.WORKER_COLUMNS, view.worker_table()))
        else:
            print(format_table(ClusterView.APPLICATION_COLUMNS, view.application_table()))
        return 0
    finally:
        admin.close()


COMMAND = Command(
    "an external shuffle cluster's workers and applications; decommission a worker", main
)
