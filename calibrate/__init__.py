"""kvroute.calibrate."""
