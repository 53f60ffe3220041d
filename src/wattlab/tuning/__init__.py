"""Online tuning of GPU settings during a training run (``wattlab tune``)."""
