"""What travels on the error and resize streams of exec and attach (sans-IO).

From protocol v4 on, the server ends a session by writing one JSON metav1.Status
on the error stream; client-go reads it to the end and turns it into the exit
code kubectl and crictl return. The bytes here match what Go's encoding/json
writes for the kubelet's Status values (field order, omitempty, HTML-safe
escaping), so clients and golden tests see exactly what they would see from
containerd. Before v4 the stream carries only the failure message as text and
nothing at all on success.

The resize stream goes the other way: the client writes a stream of JSON
objects ``{"Width":W,"Height":H}`` whenever its terminal changes size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

from pycrid.stdio import TerminalSize

STATUS_SUCCESS: Final = "Success"
STATUS_FAILURE: Final = "Failure"
REASON_NON_ZERO_EXIT_CODE: Final = "NonZeroExitCode"
REASON_INTERNAL_ERROR: Final = "InternalError"
#: The cause type carrying the exit code. metav1.StatusCause serialises its
#: Type field under the JSON key "reason".
CAUSE_EXIT_CODE: Final = "ExitCode"

#: From this protocol version on the error stream carries JSON.
JSON_STATUS_VERSION: Final = 4


class RemoteCommandError(Exception):
    """The error stream reported a failure other than a non-zero exit code,
    or did not follow the protocol. The message is what client-go would say."""


# ---------------------------------------------------------------- encoding


def success_status() -> bytes:
    """The status for a command that exited 0 (and for a finished attach)."""
    return _marshal({"metadata": {}, "status": STATUS_SUCCESS})


def exit_code_status(code: int, command: Sequence[str] | None = None) -> bytes:
    """The status for a command that exited with ``code`` (not 0).

    The message mirrors containerd: the kubelet prefixes the runtime's exit
    error, which containerd words "error executing command [argv], exit code N".
    Without ``command`` the message uses Go's plain process error, "exit
    status N". Clients parse the code from the cause as an unsigned 8-bit
    number, so codes outside 1..255 make them report a protocol error.
    """
    if code == 0:
        raise ValueError("exit code 0 is a success: use success_status()")
    if command is None:
        detail = f"exit status {code}"
    else:
        detail = f"error executing command [{' '.join(command)}], exit code {code}"
    return _marshal(
        {
            "metadata": {},
            "status": STATUS_FAILURE,
            "message": f"command terminated with non-zero exit code: {detail}",
            "reason": REASON_NON_ZERO_EXIT_CODE,
            "details": {"causes": [{"reason": CAUSE_EXIT_CODE, "message": str(code)}]},
        }
    )


def internal_error_status(message: str) -> bytes:
    """The status for a session that failed for another reason.

    ``message`` is the error itself (the kubelet passes e.g. "error executing
    command in container: ..."); like apimachinery's NewInternalError the
    status message gets an "Internal error occurred: " prefix and the bare
    text goes in the single cause.
    """
    cause: dict[str, Any] = {"message": message} if message else {}
    return _marshal(
        {
            "metadata": {},
            "status": STATUS_FAILURE,
            "message": f"Internal error occurred: {message}",
            "reason": REASON_INTERNAL_ERROR,
            "details": {"causes": [cause]},
            "code": 500,
        }
    )


def encode_status_for_version(version: int, status: bytes) -> bytes:
    """What to write on the error stream for protocol ``version``.

    ``status`` is one of the JSON statuses above. From v4 it goes out as is;
    before v4 a success writes nothing and a failure writes only its message.
    """
    if version >= JSON_STATUS_VERSION:
        return status
    decoded = json.loads(status)
    if decoded.get("status") == STATUS_SUCCESS:
        return b""
    return str(decoded.get("message", "")).encode("utf-8")


_SURROGATE = re.compile("[\ud800-\udfff]")
# encoding/json escapes these by default so JSON can be embedded in HTML.
_GO_ESCAPES: Final = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_GO_ESCAPED = re.compile("[<>&\u2028\u2029]")


def _marshal(value: dict[str, Any]) -> bytes:
    """Compact JSON as Go's json.Marshal writes it (keys in the given order)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    # Go replaces invalid UTF-8 with U+FFFD; in a Python str that shows up as
    # lone surrogates (e.g. from surrogateescape), which could not be encoded.
    text = _SURROGATE.sub("\ufffd", text)
    # The characters only occur inside strings, so replacing them is safe.
    text = _GO_ESCAPED.sub(lambda m: _GO_ESCAPES[m.group()], text)
    return text.encode("utf-8")


# ---------------------------------------------------------------- client side


def parse_exit_status(data: bytes) -> int | None:
    """The exit code a v4 client derives from everything read on the error stream.

    None when the stream was empty (client-go counts that as success too);
    0 for a Success status; the ExitCode cause for NonZeroExitCode. Any other
    failure, or a malformed status, raises RemoteCommandError with the
    message client-go would give.
    """
    if not data:
        return None
    try:
        status = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RemoteCommandError(f"error stream protocol error: {exc} in {data!r}") from None
    if not isinstance(status, dict):
        raise RemoteCommandError(f"error stream protocol error: not an object in {data!r}")
    state = status.get("status")
    if state == STATUS_SUCCESS:
        return 0
    if state != STATUS_FAILURE:
        raise RemoteCommandError("error stream protocol error: unknown error")
    if status.get("reason") != REASON_NON_ZERO_EXIT_CODE:
        raise RemoteCommandError(str(status.get("message", "")))
    details = status.get("details")
    if not isinstance(details, dict):
        raise RemoteCommandError("error stream protocol error: details must be set")
    causes = details.get("causes") or []
    for cause in causes if isinstance(causes, list) else []:
        if not isinstance(cause, dict) or cause.get("reason") != CAUSE_EXIT_CODE:
            continue
        text = cause.get("message")
        # client-go: strconv.ParseUint(message, 10, 8).
        if not isinstance(text, str) or not text.isascii() or not text.isdigit():
            raise RemoteCommandError(
                f"error stream protocol error: invalid exit code value {text!r}"
            )
        code = int(text)
        if code > 255:
            raise RemoteCommandError(
                f"error stream protocol error: invalid exit code value {text!r}"
            )
        return code
    raise RemoteCommandError(f"error stream protocol error: no {CAUSE_EXIT_CODE} cause given")


# ---------------------------------------------------------------- resize


_WHITESPACE: Final = b" \t\r\n"
_UINT16_MAX: Final = 0xFFFF


class ResizeDecoder:
    """Turns the bytes of a resize stream into TerminalSize events.

    The client uses a json.Encoder, so objects usually end in a newline, but a
    stream guarantees no message boundaries: one chunk may hold several
    objects or a fraction of one. Objects are therefore delimited by scanning
    braces and strings, not lines. As with Go's decoder into the kubelet's
    TerminalSize, keys match case-insensitively, unknown keys are ignored and
    a missing or null field is 0; anything else (a non-object, a value that is
    not an integer 0..65535, broken JSON) raises ValueError, after which the
    decoder should be dropped: the kubelet stops reading resizes at the first
    error.
    """

    __slots__ = ("_buffer", "_max_buffer")

    def __init__(self, max_buffer: int = 64 * 1024) -> None:
        self._buffer = bytearray()
        self._max_buffer = max_buffer

    @property
    def pending(self) -> int:
        """Bytes of an incomplete object held back for the next feed."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[TerminalSize]:
        """Add ``data``; return the sizes of every object it completed."""
        self._buffer += data
        sizes: list[TerminalSize] = []
        while True:
            start = _skip_whitespace(self._buffer)
            if start == len(self._buffer):
                self._buffer.clear()
                break
            if self._buffer[start] != ord("{"):
                bad = bytes(self._buffer[start : start + 20])
                raise ValueError(f"resize stream: expected a JSON object, got {bad!r}")
            end = _object_end(self._buffer, start)
            if end is None:
                del self._buffer[:start]
                if len(self._buffer) > self._max_buffer:
                    raise ValueError(f"resize stream: object larger than {self._max_buffer} bytes")
                break
            sizes.append(_terminal_size(bytes(self._buffer[start:end])))
            del self._buffer[:end]
        return sizes


def _skip_whitespace(buffer: bytearray) -> int:
    index = 0
    while index < len(buffer) and buffer[index] in _WHITESPACE:
        index += 1
    return index


def _object_end(buffer: bytearray, start: int) -> int | None:
    """One past the '}' closing the object at ``start``, or None if not there yet.

    Braces, quotes and backslashes are ASCII and never part of a multi-byte
    UTF-8 sequence, so scanning bytes is safe.
    """
    depth = 0
    in_string = False
    escaped = False
    for index in range(start, len(buffer)):
        byte = buffer[index]
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):  # { [
            depth += 1
        elif byte in (0x7D, 0x5D):  # } ]
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def _terminal_size(raw: bytes) -> TerminalSize:
    try:
        pairs = json.loads(raw, object_pairs_hook=list)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"resize stream: invalid JSON {raw[:80]!r}: {exc}") from None
    if not isinstance(pairs, list):  # e.g. "{}" followed by "]" mismatches
        raise ValueError(f"resize stream: expected a JSON object, got {raw[:80]!r}")
    fields = {"width": 0, "height": 0}
    # Go prefers an exact key match over a case-insensitive one; with only
    # two fields that differ in more than case, folding is equivalent, and
    # the last occurrence wins as in Go.
    for key, value in pairs:
        name = key.lower()
        if name not in fields or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"resize stream: {key} must be an integer, got {value!r}")
        if not 0 <= value <= _UINT16_MAX:
            raise ValueError(f"resize stream: {key} {value} is out of range 0..65535")
        fields[name] = value
    return TerminalSize(width=fields["width"], height=fields["height"])
