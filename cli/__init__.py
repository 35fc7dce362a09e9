"""kvroute.cli."""
