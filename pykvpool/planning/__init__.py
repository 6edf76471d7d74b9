"""Capacity planning, pure arithmetic over presets: models, hardware, the memory ledger,
video token counts, workloads (request lengths), static capacity sweeps through the pool,
rooflines (and the simulator's step-time model)."""
