"""kvroute.sim.study: Studies built from runs: scenarios, experiments, sweeps, sensitivity, executors, plots."""
