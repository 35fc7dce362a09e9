"""kvroute.calibrate.calibration: measuring live servers (prompts, sweeps, bursts) and fitting profiles."""
