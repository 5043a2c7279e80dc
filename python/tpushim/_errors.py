"""tpushim's exceptions: one class per status code under tpushim.Error.

The runtime's errors keep libtpu's text as their message. A device memory
exhaustion also carries XLA's report of what holds the memory, in the
message and, on its own, in ``.report``.
"""

__all__ = [
    "Error", "CancelledError", "UnknownError", "InvalidArgumentError",
    "DeadlineExceededError", "NotFoundError", "AlreadyExistsError",
    "PermissionDeniedError", "ResourceExhaustedError",
    "FailedPreconditionError", "AbortedError", "OutOfRangeError",
    "UnimplementedError", "InternalError", "UnavailableError",
    "DataLossError", "UnauthenticatedError",
]


class Error(Exception):
    """A status the runtime returned.

    Attributes:
      code: abseil's number for the status code (3 for INVALID_ARGUMENT).
      code_name: its name, "INVALID_ARGUMENT".
      message: the runtime's text (libtpu's wording).
      report: XLA's memory report for a device memory exhaustion, else None.
    """

    code = 2
    code_name = "UNKNOWN"

    def __init__(self, message="", report=None):
        super().__init__(message)
        self.message = message
        self.report = report

    def __str__(self):
        return "%s: %s" % (self.code_name, self.message)


def _define(name, code, code_name, *bases, doc):
    cls = type(name, (Error,) + bases,
               {"code": code, "code_name": code_name, "__doc__": doc,
                "__module__": "tpushim"})
    globals()[name] = cls
    return cls


_CLASSES = {}
for _name, _code, _code_name, _bases, _doc in [
    ("CancelledError", 1, "CANCELLED", (),
     "The operation was cancelled (its System shut down before it ran)."),
    ("UnknownError", 2, "UNKNOWN", (), "An error of unknown kind."),
    ("InvalidArgumentError", 3, "INVALID_ARGUMENT", (ValueError,),
     "A bad setting or argument; also a ValueError."),
    ("DeadlineExceededError", 4, "DEADLINE_EXCEEDED", (TimeoutError,),
     "A deadline passed; also a TimeoutError."),
    ("NotFoundError", 5, "NOT_FOUND", (), "Something named was not found."),
    ("AlreadyExistsError", 6, "ALREADY_EXISTS", (), "It exists already."),
    ("PermissionDeniedError", 7, "PERMISSION_DENIED", (),
     "The OS refused (a lock file, a device node, memlock)."),
    ("ResourceExhaustedError", 8, "RESOURCE_EXHAUSTED", (),
     "The premapped region, device memory or the host ran out."),
    ("FailedPreconditionError", 9, "FAILED_PRECONDITION", (),
     "The call does not fit the state (e.g. a System inherited by fork())."),
    ("AbortedError", 10, "ABORTED", (), "The operation was aborted."),
    ("OutOfRangeError", 11, "OUT_OF_RANGE", (), "Out of range."),
    ("UnimplementedError", 12, "UNIMPLEMENTED", (), "Not implemented."),
    ("InternalError", 13, "INTERNAL", (), "An internal error."),
    ("UnavailableError", 14, "UNAVAILABLE", (),
     "Not available now (a chip held by another process, ...)."),
    ("DataLossError", 15, "DATA_LOSS", (), "Data were lost."),
    ("UnauthenticatedError", 16, "UNAUTHENTICATED", (), "Unauthenticated."),
]:
    _CLASSES[_code] = _define(_name, _code, _code_name, *_bases, doc=_doc)

_REPORT_START = "Ran out of memory in memory space"


def _from_status(code, message):
    """The exception for an absl status (called by the extension)."""
    cls = _CLASSES.get(code, UnknownError)
    report = None
    at = message.find(_REPORT_START)
    if at >= 0:
        report = message[at:]
    return cls(message, report)
