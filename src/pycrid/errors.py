"""Error kinds shared by every layer.

Code raises one of these with a message a person understands; only the gRPC
edge (``pycrid.cri.instrument``) turns the kind into a status code, the way
containerd's errdefs are mapped in one place.
"""

from __future__ import annotations


class PycridError(Exception):
    """Base of all error kinds; ``kind`` names the gRPC code it maps to."""

    kind = "UNKNOWN"


class Unknown(PycridError):
    """A failure of an outside program (runc, conmon) that fits no other kind;
    containerd answers these with gRPC Unknown too."""


class NotFound(PycridError):
    kind = "NOT_FOUND"


class AlreadyExists(PycridError):
    kind = "ALREADY_EXISTS"


class InvalidArgument(PycridError):
    kind = "INVALID_ARGUMENT"


class FailedPrecondition(PycridError):
    kind = "FAILED_PRECONDITION"


class Unavailable(PycridError):
    kind = "UNAVAILABLE"


class DeadlineExceeded(PycridError):
    kind = "DEADLINE_EXCEEDED"


class Unauthenticated(PycridError):
    kind = "UNAUTHENTICATED"


class PermissionDenied(PycridError):
    kind = "PERMISSION_DENIED"


class ResourceExhausted(PycridError):
    kind = "RESOURCE_EXHAUSTED"


class NoSpace(ResourceExhausted):
    """The node is out of disk space or quota (ENOSPC, EDQUOT, SQLite's "database or disk
    is full"): the message names the path, its file system and what was being written
    (``host/space.py`` makes it)."""


class Cancelled(PycridError):
    """The operation's client went away (deadline or cancel) and it was undone."""

    kind = "CANCELLED"


class DataLoss(PycridError):
    """Content that fails verification: wrong digest, corrupt archive, short read."""

    kind = "DATA_LOSS"


class Unimplemented(PycridError):
    kind = "UNIMPLEMENTED"


class Aborted(PycridError):
    kind = "ABORTED"


class Internal(PycridError):
    kind = "INTERNAL"


class _CRIErrorName(PycridError):
    """An error the kubelet recognises by name (cri-api's ``crierrors``): it reads the
    name only at the start of the message of an answer with code UNKNOWN, whose code
    cri-client strips; so the message starts ``<Name>: `` and the kind is UNKNOWN."""

    name = ""

    def __init__(self, message: str) -> None:
        prefix = f"{self.name}: "
        super().__init__(message if message.startswith(prefix) else prefix + message)


class SignatureValidationFailed(_CRIErrorName):
    """The signature policy refuses the image (CRI-O's answer, the kubelet's reason)."""

    name = "SignatureValidationFailed"


class RegistryUnavailable(_CRIErrorName, Unavailable):
    """The registry cannot be reached (refused, not resolvable, failing with 5xx). An
    Unavailable (the next mirror is tried) whose code is UNKNOWN, as CRI-O answers."""

    kind = "UNKNOWN"
    name = "RegistryUnavailable"
