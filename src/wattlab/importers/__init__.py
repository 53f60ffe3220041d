"""Other tools' power logs (and an HMC8015's own logs) turned into wattlab run files."""
