"""Live status of a running job: each rank's step, open regions, collective and stack, and the stall detector."""
