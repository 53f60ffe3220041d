"""One error hierarchy for the whole package.

Foreign errors (pyzmq, h5py, pyserial, pyvisa, NVML) are converted at the boundary with
``raise ... from e`` so a caller can catch ``WattlabError`` and print one clear line.
"""


class WattlabError(Exception):
    """Base of every error wattlab raises on purpose."""


class UsageError(WattlabError):
    """The user asked for something impossible (bad argument, existing output file...).

    The CLI maps it to exit status 2.
    """


class RunFileError(UsageError):
    """A run file is missing, corrupt, or not in the layout wattlab writes (bad input: exit 2)."""


class BusError(WattlabError):
    """The message bus failed or carried a malformed message."""


class MalformedMessageError(BusError):
    """A bus message did not validate; it is rejected without harming the session."""


class MeterError(WattlabError):
    """An instrument (external meter or GPU driver) failed."""


class MeterTimeoutError(MeterError):
    """An instrument did not answer in time."""


class MeterProtocolError(MeterError):
    """An instrument answered with bytes that break its protocol."""


class NvmlError(MeterError):
    """The NVML library is missing or a call into it failed."""


class NvmlMissingError(NvmlError):
    """No NVML library or no NVIDIA driver: this machine has no GPU wattlab can read."""
