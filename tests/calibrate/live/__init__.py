"""Tests of ``kvroute.calibrate.live``."""
