"""Which meters exist, how users name them (``--meter``, bench files, discovery), disk cost."""
