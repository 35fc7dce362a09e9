"""Tests of ``kvroute.traces``."""
