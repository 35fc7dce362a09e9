"""Tests of ``kvroute.calibrate``."""
