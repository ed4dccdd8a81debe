"""What a facts snapshot's words mean, read alike by the gathering (probe layer) and the diagnosis (pure): its paths
in the checked machine's own flavour (`paths`), and the job schedulers' variables (`schedulers`). Pure Python."""
