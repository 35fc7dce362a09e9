"""kvroute.sim.timing: How long things take: step costs, decode-run times, the API server and host model, profiles."""
