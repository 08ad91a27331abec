"""The node package's errors: one subclass of :class:`FerryError` per kind of failure.

Errors that cross the wire carry a short ``code`` so the client can tell a refusal
(bad input, wrong secret) from a transient condition it should retry (not primary,
replication failed, no owner yet).

Every error also says what became of the request (``outcome``, on the wire too): a
write that failed with ``refused`` was certainly not applied, one with ``unknown`` may
have been applied, or may still be (its update is durable on the primary but was not
acknowledged, the reply was lost, the handler failed midway). A client retries an
``unknown`` write with the same request id, which cannot apply it twice
(docs/node.md, "Request ids")."""
from __future__ import annotations

from faults import FerryError

REFUSED = "refused"     # certainly not applied
UNKNOWN = "unknown"     # may have been applied, or may still be


class NodeError(FerryError):
    """Base of every error the node package raises on purpose."""

    code = "internal"
    retry = False
    outcome = REFUSED

    def __init__(self, message: str) -> None:
        self.reason = message
        super().__init__(message)

    def maybe_applied(self) -> "NodeError":
        """Mark this error as raised after the request may have taken effect."""
        self.outcome = UNKNOWN
        return self


class ConfigError(NodeError):
    """A config file or flag is invalid; the message names the key and what to do."""

    code = "config"


class IllegalTransition(NodeError):
    """A partition state change that the state table does not allow."""

    code = "illegal_transition"


class DataDirError(NodeError):
    """The data dir holds something the node cannot use (a damaged or missing file, a
    directory where a file belongs, no permission); found at start-up. The message says
    what, where and what to do; ``ferry node start`` exits 2 with it."""

    code = "data_dir"


class DataDirLocked(NodeError):
    """Another node process holds the data directory."""

    code = "locked"


class AuthFailed(NodeError):
    """The peer did not prove it knows the cluster secret (or we did not)."""

    code = "auth"


class BadRequest(NodeError):
    """A malformed request: unknown method, missing or mistyped field."""

    code = "bad_request"


class BadReply(NodeError):
    """A peer's reply that does not decode as the method's reply (a garbage or forged
    reply, or a peer that speaks another protocol): the request was sent, so it may
    have had an effect."""

    code = "bad_reply"
    outcome = UNKNOWN


class TooLarge(NodeError):
    """A key or value over the documented limits."""

    code = "too_large"


class NotPrimary(NodeError):
    """This node is not the primary of the partition; ``hint`` names who may be."""

    code = "not_primary"
    retry = True

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.hint = hint
        super().__init__(message)


class Unavailable(NodeError):
    """The cluster cannot serve the request now (no owner, replication failed, node
    shutting down); retrying later may succeed."""

    code = "unavailable"
    retry = True


class OutcomeUnknown(Unavailable):
    """A request to the controller (``P/requests/...``) whose outcome this node cannot
    tell: the wait for the answer ran out and withdrawing the request failed (etcd
    unreachable), or the controller decided it but this node could not read or see the
    result. It may have been applied, or may still be, until the request key
    (``key``, put at revision ``rev``) is gone from etcd; once this node's map is at or
    past ``rev`` without the key, the map shows the outcome. A caller whose safety
    depends on the outcome keeps assuming the worst until then (node/updates.py,
    ``op_join_isr``)."""

    code = "outcome_unknown"
    outcome = UNKNOWN

    def __init__(self, message: str, key: str = "", rev: int = 0) -> None:
        self.key = key
        self.rev = rev
        super().__init__(message)


class RemoteFailure(NodeError):
    """The peer answered with an error; ``code`` is the peer's code."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        self.code = code
        self.hint = hint
        self.retry = code in RETRYABLE
        super().__init__(message)


class StaleEpoch(NodeError):
    """A replication or DEMAND carried an older partition epoch than this node knows:
    the sender is no longer the primary it believes it is (or lags the map)."""

    code = "stale_epoch"
    retry = True


class ControlPlaneDown(Unavailable):
    """etcd (the control plane) cannot be reached at any configured endpoint."""

    code = "control_plane"


class LeaseGone(ControlPlaneDown):
    """etcd no longer knows the lease (it expired): the node registers again."""
    code = "control_plane"


class ControlPlaneError(NodeError):
    """etcd refused a request for a reason other than its availability (too large,
    permission denied) or answered something that cannot be read."""
    code = "control_plane_error"


class ControlPlaneTLSError(ConfigError):
    """The control plane's TLS certificate cannot be verified: a setup error, not an
    outage (a node stops at once with this message instead of waiting)."""
    code = "config"


class WatchCompacted(NodeError):
    """etcd compacted the revision a watch resumes from: the watcher reloads the whole
    prefix (control.View does this itself; it never reaches a caller)."""

    def __init__(self, rev: int) -> None:
        self.rev = rev
        super().__init__(f"watch revision compacted (now {rev})")


class PlanError(NodeError):
    """A reassignment plan (node/reassign.py) is malformed or does not fit the cluster
    (a dead or unknown node, an unknown cache, a partition out of range)."""

    code = "bad_plan"


class Superseded(NodeError):
    """A write whose request id is older than the oldest one its client still waits
    for: a late copy of a request the client has given up on. Never applied."""

    code = "superseded"


RETRYABLE = {NotPrimary.code, Unavailable.code, StaleEpoch.code, ControlPlaneDown.code,
             OutcomeUnknown.code}

BY_CODE: dict[str, type[NodeError]] = {
    c.code: c for c in (ConfigError, IllegalTransition, AuthFailed, BadRequest, TooLarge,
                        NotPrimary, Unavailable, StaleEpoch, ControlPlaneDown, OutcomeUnknown,
                        Superseded)
}
