"""Tests of ``kvroute.sim.routing``."""
