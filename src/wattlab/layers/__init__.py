"""Per-layer work, energy and clock plans of a PyTorch model (`wattlab layers`).

counting: FLOPs, MACs and bytes per leaf module, forward and backward; roofline: peak
FLOP/s and bandwidth; cost_model: the simulated GPU's time and energy of a layer at a clock
pair; measure: per-layer energy in isolation (simulated or real GPU); plan: the clock pair
per layer (dynamic programming with switch costs, and the arithmetic-intensity heuristic).
"""
