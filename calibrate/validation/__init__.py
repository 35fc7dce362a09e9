"""kvroute.calibrate.validation: replaying a trace live and reporting it against the simulator."""
