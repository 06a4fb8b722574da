"""Who a presented token says its holder is, and what that holder may call.

The cluster's secret (``external-shuffle.auth.token-file``) is held by the daemons (and by
clients trusted with everything): it may call anything. Everyone else holds a credential
derived from it, bound to a role, a name and an expiry, which a daemon checks without keeping
any state:

    pyshuffle:<role>:<name>:<expires, unix seconds>:<HMAC-SHA256 of the rest, base64url>

(keyed with HMAC-SHA256(secret, "pyshuffle operator credential v1")).

An operator issues (``pyshuffle admin credential``): ``reader``, the status page and the
``admin`` listings; ``admin``, also decommissioning; ``client``, for a team's drivers, which
may only register applications. A coordinator issues, to the driver that registers an
application, an ``application`` credential named by the application's id: it may make that
application's calls (its jobs, placements, pushes, commits, fetches, releases) and touch no
other application's partitions; its drivers give it to its executors in place of any other.
Its pushes and commits carry the coordinator's signed placement of the partition for it
(:meth:`CredentialCheck.placement`): a partition placed for one application is written by it
alone, even before its first push.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from external_shuffle.wire.auth import AUTHORIZATION
from external_shuffle.wire.stubs import pb
from shuffle_api import (
    AuthenticationError,
    InvalidIdentifierError,
    PermissionDeniedError,
    ResultPartitionID,
)
from shuffle_api.ids import new_id, validate_id

__all__ = [
    "CLIENT_CREDENTIAL_PREFIX",
    "CLUSTER_CREDENTIAL",
    "CREDENTIAL_PREFIX",
    "OPERATOR_ROLES",
    "Credential",
    "CredentialCheck",
    "Role",
    "application_id_for",
    "application_token",
    "data_port_identity",
    "grpc_method",
    "is_clients_application",
    "operator_token",
]

_SEPARATOR: Final = ":"  # never in an id, nor in base64url
_PREFIX: Final = "pyshuffle"
CREDENTIAL_PREFIX: Final = _PREFIX + _SEPARATOR
"""How every operator's credential starts (the cluster's secret must not)."""
_SIGNING_KEY_LABEL: Final = b"pyshuffle operator credential v1"
_PLACEMENT_KEY_LABEL: Final = b"pyshuffle placement v1"
_MAX_CLIENT_NAME: Final = 64
_CLIENT_APPLICATION: Final = ".app-"  # between a client's name and its application's id
_MAX_TOKEN: Final = 512  # a longer one is no credential of ours: refused before any parsing


class Role(enum.Enum):
    """What a credential may call."""

    CLUSTER = "cluster"  # the cluster's secret: everything
    ADMIN = "admin"  # the listings, the status page, decommissioning
    READER = "reader"  # the listings and the status page
    CLIENT = "client"  # registering applications
    APPLICATION = "application"  # one application's own calls (its id is the name)

    def may_call(self, method: str) -> bool:
        """Whether this role may call the gRPC ``method`` (``/package.Service/Method``)."""
        if self is Role.CLUSTER:
            return True
        if self is Role.CLIENT:
            return method == _REGISTER_APPLICATION
        if self is Role.APPLICATION:
            return method in _APPLICATION_METHODS
        return method in _READER_METHODS or (self is Role.ADMIN and method in _ADMIN_METHODS)


def grpc_method(service: str, name: str) -> str:
    """The path gRPC gives a method of ours (``/package.Service/Method``), checked against the
    generated descriptors."""
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    return f"/{descriptor.full_name}/{descriptor.methods_by_name[name].name}"


_READER_METHODS: Final = frozenset(
    {grpc_method("Coordinator", "ListWorkers"), grpc_method("Coordinator", "ListApplications")}
)
# Operators decommission through a coordinator, which passes it on with the cluster's secret.
_ADMIN_METHODS: Final = frozenset({grpc_method("Coordinator", "DecommissionWorker")})
_REGISTER_APPLICATION: Final = grpc_method("Coordinator", "RegisterApplication")
_FETCH_DATA: Final = grpc_method("Worker", "FetchData")
_APPLICATION_METHODS: Final = frozenset(
    grpc_method(service, name)
    for service, names in (
        (
            "Coordinator",
            (
                "RegisterApplication",
                "ApplicationHeartbeat",
                "UnregisterApplication",
                "RegisterJob",
                "UnregisterJob",
                "RegisterPartition",
                "RegisterPartitions",
                "ReleasePartitions",
                "GetPartitionStatus",
                "ReportUnreachableWorker",
            ),
        ),
        (
            "Worker",
            (
                "PushData",
                "PushPartition",
                "CommitPartition",
                "MergePartitions",
                "FetchData",
                "ReleasePartitions",
                "GetPartitionStatus",
            ),
        ),
    )
    for name in names
)
OPERATOR_ROLES: Final = (Role.ADMIN, Role.READER, Role.CLIENT)
"""The roles ``pyshuffle admin credential`` issues."""
_SIGNED_ROLES: Final = (*OPERATOR_ROLES, Role.APPLICATION)
CLIENT_CREDENTIAL_PREFIX: Final = f"{CREDENTIAL_PREFIX}{Role.CLIENT.value}{_SEPARATOR}"
"""How a client's credential starts: its driver takes its application's credential instead."""


@dataclass(frozen=True, slots=True)
class Credential:
    """Who presented a token: its role, the name it was issued to, and until when it holds
    (None: the cluster's secret, which does not expire)."""

    role: Role
    name: str
    expires_at: int | None

    def __str__(self) -> str:
        return (
            "the cluster's secret"
            if self.role is Role.CLUSTER
            else f"{self.role.value} {self.name!r}"
        )

    def check_may_call(self, method: str) -> None:
        """Raise PermissionDeniedError unless this credential may call ``method``."""
        if not self.role.may_call(method):
            allowed = (
                "an admin credential"
                if method in _ADMIN_METHODS
                else "an application's credential"
                if method in _APPLICATION_METHODS
                else "the cluster's secret"
            )
            raise PermissionDeniedError(
                f"{method.rsplit('/', 1)[-1]} is not for {self}: it needs {allowed}"
            )

    def check_application(self, application_id: str, action: str) -> None:
        """Raise PermissionDeniedError, naming both applications, unless this credential may
        ``action`` (``"fetch partition P of"``, ``"act for"``) ``application_id``: the
        cluster's secret
        may for any, an application's credential for its own only (not for what no
        application owns)."""
        if self.role is Role.CLUSTER or (
            self.role is Role.APPLICATION and self.name == application_id
        ):
            return
        owner = f"application {application_id}" if application_id else "no application"
        raise PermissionDeniedError(f"{self} may not {action} {owner}")

    def check_partition(self, owner: str, action: str, partition: object) -> None:
        """:meth:`check_application` for ``action`` (``"fetch"``) on ``partition``, which
        ``owner`` holds."""
        self.check_application(owner, f"{action} partition {partition} of")


def _derived_key(secret: str, label: bytes) -> bytes:
    # Keys of their own, derived from the secret: the secret itself keys the data ports' HMACs.
    return hmac.new(secret.encode(), label, hashlib.sha256).digest()


def _signing_key(secret: str) -> bytes:
    return _derived_key(secret, _SIGNING_KEY_LABEL)


def _signed(key: bytes, payload: str) -> str:
    """``payload`` and its signature: the whole credential."""
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return f"{payload}{_SEPARATOR}{base64.urlsafe_b64encode(digest).rstrip(b'=').decode()}"


def _token(secret: str, role: Role, name: str, expires_at: int) -> str:
    payload = _SEPARATOR.join((_PREFIX, role.value, name, str(int(expires_at))))
    return _signed(_signing_key(secret), payload)


def operator_token(secret: str, role: Role, name: str, expires_at: int) -> str:
    """A credential an operator issues: ``role`` (admin, reader or client) under ``name``
    until ``expires_at`` (unix seconds), signed with the cluster's ``secret``."""
    if role not in OPERATOR_ROLES:
        roles = ", ".join(role.value for role in OPERATOR_ROLES)
        raise InvalidIdentifierError(f"operators issue {roles} credentials, not {role.value}")
    validate_id(name, "operator name")
    if role is Role.CLIENT and (len(name) > _MAX_CLIENT_NAME or "." in name):
        # Its applications' ids are named after it (<name>.app-<id>), within an id's 128
        # characters, and no client's name may be a prefix another's ids would share.
        raise InvalidIdentifierError(
            f"a client's name has {_MAX_CLIENT_NAME} characters at most, and no '.'"
        )
    return _token(secret, role, name, expires_at)


def application_token(secret: str, application_id: str, expires_at: int) -> str:
    """The credential a coordinator issues to the application ``application_id`` until
    ``expires_at`` (unix seconds)."""
    validate_id(application_id, "application id")
    return _token(secret, Role.APPLICATION, application_id, expires_at)


CLUSTER_CREDENTIAL: Final = Credential(Role.CLUSTER, "cluster", None)


def application_id_for(token: str) -> str:
    """A new application's id for a driver presenting ``token``: named after its client
    (:func:`is_clients_application`) when it is a client's credential, whose holder may
    register only such ids."""
    if token.startswith(CLIENT_CREDENTIAL_PREFIX):
        client = token[len(CLIENT_CREDENTIAL_PREFIX) :].split(_SEPARATOR, 1)[0]
        return f"{client}{_CLIENT_APPLICATION}{new_id()}"
    return f"app-{new_id()}"


def is_clients_application(client: str, application_id: str) -> bool:
    """Whether ``application_id`` is one the client named ``client`` may register:
    ``<client>.app-<32 hex digits>``, as :func:`application_id_for` makes them."""
    return (
        re.fullmatch(rf"{re.escape(client + _CLIENT_APPLICATION)}[0-9a-f]{{32}}", application_id)
        is not None
    )


def data_port_identity(token: str) -> bytes:
    """What a client holding ``token`` names on a data port: a credential's public part (its
    signature is the secret it proves), nothing for the cluster's secret."""
    if token.startswith(CREDENTIAL_PREFIX):
        return token.rpartition(_SEPARATOR)[0].encode()
    return b""


class CredentialCheck:
    """Tells a presented token's credential, with the cluster's secret and a clock."""

    def __init__(self, secret: str, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._secret_bytes = secret.encode()
        self._signing_key = _signing_key(secret)
        self._placement_key = _derived_key(secret, _PLACEMENT_KEY_LABEL)
        self._clock = clock

    def placement(self, partition: ResultPartitionID, application_id: str) -> bytes:
        """A coordinator's signature that it placed ``partition`` for ``application_id``:
        what a worker asks of that application's pushes and commits (ids hold no '/', '#' or
        '@', so the signed text names one pair only)."""
        signed = f"{application_id}/{partition}".encode()
        return hmac.new(self._placement_key, signed, hashlib.sha256).digest()

    def check_placement(
        self, caller: Credential, partition: ResultPartitionID, placement: bytes, action: str
    ) -> None:
        """PermissionDeniedError unless ``caller`` holds the cluster's secret or ``placement``
        is the coordinator's for ``partition`` and the caller's application: an application
        may ``action`` (``"push into"``) only what was placed for it."""
        if caller.role is Role.CLUSTER:
            return
        if not hmac.compare_digest(placement, self.placement(partition, caller.name)):
            raise PermissionDeniedError(
                f"{caller} may not {action} {partition}: no coordinator placed it for"
                f" application {caller.name}"
                + ("" if placement else " (the request carries no placement)")
            )

    def data_port_key(self, identity: bytes) -> bytes:
        """What a data port client that names ``identity`` proves: the cluster's secret (no
        identity), or the application credential whose public part it is (signed here, so
        only its holder knows it). AuthenticationError for any other identity."""
        return self._data_port_credential(identity)[0]

    def data_port_caller(self, identity: bytes) -> Credential:
        """Who a data port client that named ``identity`` (and proved it) is."""
        return self._data_port_credential(identity)[1]

    def _data_port_credential(self, identity: bytes) -> tuple[bytes, Credential]:
        if not identity:
            return self._secret_bytes, CLUSTER_CREDENTIAL
        try:
            token = _signed(self._signing_key, identity.decode("ascii")).encode()
        except UnicodeDecodeError:
            raise AuthenticationError("wrong identity") from None
        credential = self.credential_of(token)
        credential.check_may_call(_FETCH_DATA)
        return token, credential

    def application_token(self, application_id: str, lifetime: float) -> str:
        """A credential for the application ``application_id``, for ``lifetime`` seconds."""
        return application_token(self._secret, application_id, int(self._clock() + lifetime))

    def credential_of_call(self, metadata: Iterable[tuple[str, str | bytes]]) -> Credential:
        """The credential a call's metadata presents (``authorization: Bearer <token>``);
        AuthenticationError if none, or none it proves."""
        presented = dict(metadata).get(AUTHORIZATION)
        if presented is None:
            raise AuthenticationError(
                "no token: calls need metadata 'authorization: Bearer <token>'"
            )
        scheme, _, token = (
            presented.encode() if isinstance(presented, str) else presented
        ).partition(b" ")
        if scheme != b"Bearer":
            raise AuthenticationError("wrong token")
        return self.credential_of(token)

    def credential_of(self, presented: bytes) -> Credential:
        """The credential ``presented`` proves; AuthenticationError naming the problem if it
        proves none (wrong, forged, expired or malformed)."""
        if hmac.compare_digest(presented, self._secret_bytes):
            return CLUSTER_CREDENTIAL
        if len(presented) > _MAX_TOKEN or not presented.startswith(CREDENTIAL_PREFIX.encode()):
            raise AuthenticationError("wrong token")
        try:
            payload = presented.decode("ascii").rpartition(_SEPARATOR)[0]
            _, role_name, name, expires = payload.split(_SEPARATOR)
            role, expires_at = Role(role_name), int(expires)
        except ValueError:  # not ASCII, too few or many fields, unknown role, no number
            raise AuthenticationError("wrong token") from None
        if role not in _SIGNED_ROLES or not hmac.compare_digest(
            presented, _signed(self._signing_key, payload).encode()
        ):
            raise AuthenticationError("wrong token")
        if self._clock() >= expires_at:
            raise AuthenticationError(
                f"the {role.value} credential of {name!r} expired at"
                f" {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(expires_at))}"
            )
        return Credential(role, name, expires_at)
