"""Tests of ``kvroute.calibrate.calibration``."""
