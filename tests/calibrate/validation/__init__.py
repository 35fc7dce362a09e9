"""Tests of ``kvroute.calibrate.validation``."""
