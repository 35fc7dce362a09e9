"""kvroute.traces."""
