"""The Ray placement: the run's roles as Ray actors on one or several nodes."""
