"""Running a sweep: the job queue, signals, the executors, and ``run_sweep`` / ``resume_sweep``
(``attnbench.run.sweep``)."""
