"""Tests of ``kvroute.sim.cluster``."""
