"""Tests of ``kvroute.sim.study``."""
