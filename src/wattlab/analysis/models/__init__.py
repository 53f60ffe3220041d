"""Models over settings: energy/time/EDP fits, power models, sweeps, sparse prediction."""
