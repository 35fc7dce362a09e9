"""Tests of ``kvroute.sim.timing``."""
