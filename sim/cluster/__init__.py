"""kvroute.sim.cluster.cluster: One simulated run: workers in SimPy time, the router between them, the workload, the records."""
