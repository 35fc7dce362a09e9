"""kvroute's tests, in folders that mirror the packages (``tests/sim/engine`` tests ``kvroute.sim.engine``, ...);
whole-project tests (layers, golden records, fuzzing, notebooks, bad inputs) at this level, helpers
in ``tests/support``. A package, so that test modules are named by their path
(``tests.sim.engine.test_scheduler``) and import each other and the helpers that way."""
