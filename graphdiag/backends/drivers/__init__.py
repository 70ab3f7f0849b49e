"""Drivers: the CUDA driver (cuda.py, the only module importing cuda-python) and the simulated one (sim.py)."""
