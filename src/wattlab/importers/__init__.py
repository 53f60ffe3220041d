"""Other tools' power logs (and an HMC8015's own logs) turned into wattlab run files."""

from wattlab.importers.hmc8015_log import read_hmc8015_log
from wattlab.importers.power_logs import READERS, import_files

__all__ = [
    "READERS",
    "import_files",
    "read_hmc8015_log",
]
