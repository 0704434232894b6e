"""What a run reports: run directory, console progress, dashboard, doctor, early stop."""
