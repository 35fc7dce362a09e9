"""Tests of ``kvroute.cli``."""
