"""Tests of ``kvroute.sim``."""
