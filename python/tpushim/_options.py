"""System(**options): keyword options → the dict the extension takes.

Keywords are the C++ OptionOverrides field names. Values are checked for
their Python type here (TypeError/ValueError naming the keyword); the
runtime then validates them as it validates its environment variables
(tpushim.InvalidArgumentError, also a ValueError, naming the option).
"""

import re

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "p": 1 << 50}
_U64 = (1 << 64) - 1
_INT = (-(1 << 31), (1 << 31) - 1)


def parse_size(value, name="size"):
    """Bytes from an int or a size string: "4G", "64M", "512K", "4096".

    Units are powers of 1024 ("4G" == "4GiB" == 4 * 2**30). ValueError or
    TypeError naming `name` otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError("%s=%r: a size is an int of bytes or a string such "
                        "as '4G'" % (name, value))
    if isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise ValueError("%s=%r: not a size; write bytes (4294967296) or "
                             "a number with K, M, G or T (1024-based): '4G'"
                             % (name, value))
        value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 0:
        raise ValueError("%s=%d: a size cannot be negative" % (name, value))
    if value > _U64:
        raise ValueError("%s=%d: larger than 2**64-1" % (name, value))
    return value


def _size(name, value):
    return parse_size(value, name)


def _int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s=%r: expected an int" % (name, value))
    if not _INT[0] <= value <= _INT[1]:
        raise ValueError("%s=%d: out of range" % (name, value))
    return value


def _str(name, value):
    if not isinstance(value, str):
        if hasattr(value, "__fspath__"):
            return str(value.__fspath__())
        raise TypeError("%s=%r: expected a string" % (name, value))
    return value


def _bool(name, value):
    if not isinstance(value, bool):
        raise TypeError("%s=%r: expected True or False" % (name, value))
    return value


def _ints(name, value):
    if isinstance(value, str):
        try:
            return [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ValueError("%s=%r: expected comma-separated integers"
                             % (name, value)) from None
    if isinstance(value, (list, tuple)):
        return [_int(name, x) for x in value]
    raise TypeError("%s=%r: expected a list of ints or a string '0,1'"
                    % (name, value))


def _numa(name, value):
    if value is None or value == "auto":
        return None
    return _int(name, value)


FIELDS = {
    "premapped_buffer_size": _size,
    "premapped_buffer_transfer_threshold_bytes": _size,
    "log_dir": _str,
    "min_log_level": _int,
    "stderr_log_level": _int,
    "vmodule": _str,
    "max_log_size_mb": _size,
    "log_keep": _int,
    "device": _str,
    "hugepages": _str,
    "prefault_threads": _int,
    "numa_node": _numa,
    "mlock": _str,
    "faults": _str,
    "trace_file": _str,
    "premap": _str,
    "dump_on_oom": _bool,
    "memory_profile": _str,
    "visible_chips": _ints,
    "chips_per_process_bounds": _ints,
    "process_bounds": _ints,
    "run_dir": _str,
}


def normalize(options):
    """The extension's options dict, or TypeError/ValueError naming the key."""
    out = {}
    for name, value in options.items():
        convert = FIELDS.get(name)
        if convert is None:
            raise TypeError("System() got an unexpected keyword argument %r; "
                            "the options are: %s"
                            % (name, ", ".join(sorted(FIELDS))))
        if value is None and name != "numa_node":
            continue  # not set: the flags, environment or default decide
        out[name] = convert(name, value)
    return out
