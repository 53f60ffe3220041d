"""How the driver's power reading relates to a reference: the fit and what it can tell."""
